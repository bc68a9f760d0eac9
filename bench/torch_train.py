#!/usr/bin/env python3
"""The PyTorch side of bench/train_accuracy.py: the same recipe as `duet train` (model, data,
augmentation, optimizer, schedule, label smoothing, time budget), written out in plain PyTorch so
the two accuracy-versus-time curves can be compared. Writes one JSON object per epoch (the keys
of duet's --log) to --log. With --val-fraction F the same validation split as `duet train
--val-fraction F --seed S` (stratified_split below draws it exactly as datasets/split.cpp does) is
held out: epochs are evaluated on it, and the test split once at the end with the best epoch's
weights, logged as duet logs it ({"test": true, ...}).

Run it with the PyTorch virtual environment, e.g.
  .venv-bench/bin/python bench/torch_train.py --dataset cifar10 --data ../shared/data/cifar10 \
      --model resnet18_cifar --width-mult 0.5 --epochs 15 --batch 128 --lr 0.2 --log torch.jsonl
Needs torch and (for image folders) Pillow; no torchvision.
"""
import argparse
import json
import math
import os
import random
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ---- model: torchvision's ResNet (BasicBlock), with duet's CIFAR stem option and width multiplier ----
class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, num_classes, width, cifar_stem):
        super().__init__()
        if cifar_stem:
            self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(width)
        layers, inplanes = [], width
        for i, planes in enumerate([width, 2 * width, 4 * width, 8 * width]):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes, 1)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(8 * width, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model(name, classes, width_mult):
    width = max(1, round(64 * width_mult))
    if name == "resnet18_cifar":
        return ResNet18(classes, width, cifar_stem=True)
    if name == "resnet18":
        return ResNet18(classes, width, cifar_stem=False)
    raise SystemExit(f"torch_train.py: model '{name}' is not written out here (resnet18, resnet18_cifar)")


# ---- data ---------------------------------------------------------------------------------------
def read_cifar(paths):
    raw = np.concatenate([np.fromfile(p, dtype=np.uint8).reshape(-1, 3073) for p in paths])
    labels = raw[:, 0].astype(np.int64)
    images = raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()  # HWC like duet's loader
    return images, labels


def cifar_splits(root):
    train = sorted(os.path.join(root, f) for f in os.listdir(root) if f.startswith("data_batch_") and f.endswith(".bin"))
    if not train:
        raise SystemExit(f"torch_train.py: no data_batch_*.bin in '{root}'")
    return read_cifar(train), read_cifar([os.path.join(root, "test_batch.bin")])


def folder_split(root, short_side):
    """Every image decoded once, its shorter side resized to short_side (as duet's folder cache)."""
    from PIL import Image

    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    images, labels = [], []
    for k, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            if not f.lower().endswith((".jpg", ".jpeg", ".png")):
                continue
            im = Image.open(os.path.join(root, c, f)).convert("RGB")
            w, h = im.size
            s = short_side / min(w, h)
            im = im.resize((max(short_side, int(w * s)), max(short_side, int(h * s))), Image.BILINEAR, reducing_gap=None)
            images.append(np.asarray(im))
            labels.append(k)
    return images, np.array(labels, dtype=np.int64)


def normalize(batch_u8_nhwc, mean, std):
    x = torch.from_numpy(batch_u8_nhwc).permute(0, 3, 1, 2).float().div_(255)
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    return ((x - m) / s).contiguous(memory_format=torch.channels_last)


def random_crop_flip(img, size, pad, flip, rng):
    h, w = img.shape[:2]
    padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
    top, left = rng.randint(0, h + 2 * pad - size), rng.randint(0, w + 2 * pad - size)
    out = padded[top:top + size, left:left + size]
    return out[:, ::-1] if flip and rng.random() < 0.5 else out


def random_resized_crop_flip(img, size, scale_min, flip, rng):
    """torchvision RandomResizedCrop(size, scale=(scale_min, 1)) + RandomHorizontalFlip, with PIL."""
    from PIL import Image

    h, w = img.shape[:2]
    area = h * w
    for _ in range(10):
        target = area * rng.uniform(scale_min, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = rng.randint(0, h - ch), rng.randint(0, w - cw)
            break
    else:
        ch, cw = min(h, w), min(h, w)
        top, left = (h - ch) // 2, (w - cw) // 2
    crop = Image.fromarray(img[top:top + ch, left:left + cw]).resize((size, size), Image.BILINEAR, reducing_gap=None)
    out = np.asarray(crop)
    return out[:, ::-1] if flip and rng.random() < 0.5 else out


def center_crop(img, size):
    h, w = img.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    return img[top:top + size, left:left + size]


# ---- the validation split: duet's (datasets/split.cpp, engine/rng.h), number for number -------------
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def shuffled_indices(n, seed):
    v = list(range(n))
    for i in range(n - 1, 0, -1):
        j = min(int((splitmix64(seed ^ splitmix64(i)) >> 11) * 2.0 ** -53 * (i + 1)), i)
        v[i], v[j] = v[j], v[i]
    return v


def stratified_split(labels, classes, fraction, seed):
    """(train, val) indices: round(fraction * n_c) of each class c for validation, as duet draws them."""
    train, val = [], []
    for c in range(classes):
        members = [i for i, label in enumerate(labels) if label == c]
        n_val = math.floor(fraction * len(members) + 0.5)  # llround: halves away from zero
        if not 0 < n_val < len(members):
            raise SystemExit(f"torch_train.py: --val-fraction {fraction} leaves class {c} ({len(members)} images) empty")
        order = shuffled_indices(len(members), splitmix64((seed & M64) ^ splitmix64((c + 0x76616c5f73706c74) & M64)))
        for k, o in enumerate(order):
            (val if k < n_val else train).append(members[o])
    return sorted(train), sorted(val)


# ---- training -------------------------------------------------------------------------------------
def evaluate(model, images, labels, make_eval_batch, batch):
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            x = make_eval_batch(range(i, min(i + batch, len(labels))))
            y = torch.from_numpy(labels[i:i + batch])
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    return loss_sum / len(labels), correct / len(labels)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=["cifar10", "folder"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--width-mult", type=float, default=0.5)
    ap.add_argument("--image-size", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--pct-start", type=float, default=0.3)
    ap.add_argument("--crop-padding", type=int, default=4)
    ap.add_argument("--scale-min", type=float, default=0.35)
    ap.add_argument("--stop-after-minutes", type=float, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--val-fraction", type=float, default=0,
                    help="hold out this fraction of the training set (duet's split for the same --seed) to choose the "
                         "best epoch on; the test split is then evaluated once, at the end")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"],
                    help="bf16: torch.autocast('cpu', torch.bfloat16) around the forward and the loss, in training "
                         "and evaluation (what duet train --amp bf16 does)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    if a.dataset == "cifar10":
        size = a.image_size or 32
        (tr_x, tr_y), (te_x, te_y) = cifar_splits(a.data)
        mean, std = CIFAR_MEAN, CIFAR_STD
        make_train = lambda idx: normalize(np.stack([random_crop_flip(tr_x[i], size, a.crop_padding, True, rng) for i in idx]), mean, std)
        make_eval = lambda idx: normalize(te_x[list(idx)], mean, std)
    else:
        size = a.image_size or 64
        short = (size * 8 + 3) // 7
        t0 = time.time()
        tr_x, tr_y = folder_split(os.path.join(a.data, "train"), short)
        te_x, te_y = folder_split(os.path.join(a.data, "test"), short)
        print(f"decoded {len(tr_y)} + {len(te_y)} images in {time.time() - t0:.1f} s", flush=True)
        mean, std = IMAGENET_MEAN, IMAGENET_STD
        make_train = lambda idx: normalize(np.stack([random_resized_crop_flip(tr_x[i], size, a.scale_min, True, rng) for i in idx]), mean, std)
        make_eval = lambda idx: normalize(np.stack([center_crop(te_x[i], size) for i in idx]), mean, std)

    classes = int(max(tr_y.max(), te_y.max())) + 1
    va_x = va_y = make_val = None
    if a.val_fraction > 0:
        tr_idx, va_idx = stratified_split(tr_y.tolist(), classes, a.val_fraction, a.seed)
        if a.dataset == "cifar10":
            va_x, tr_x = tr_x[va_idx], tr_x[tr_idx]
            make_val = lambda idx: normalize(va_x[list(idx)], mean, std)
        else:
            va_x, tr_x = [tr_x[i] for i in va_idx], [tr_x[i] for i in tr_idx]
            make_val = lambda idx: normalize(np.stack([center_crop(va_x[i], size) for i in idx]), mean, std)
        va_y, tr_y = tr_y[va_idx], tr_y[tr_idx]
        print(f"validation: {len(va_y)} of the {len(va_y) + len(tr_y)} training images held out "
              f"(--val-fraction {a.val_fraction:g}, stratified, seed {a.seed})", flush=True)
    best = None  # (validation accuracy, epoch, weights)
    model = make_model(a.model, classes, a.width_mult).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, nesterov=True, weight_decay=a.weight_decay)
    steps_per_epoch = math.ceil(len(tr_y) / a.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.epochs * steps_per_epoch,
                                                pct_start=a.pct_start, cycle_momentum=False)
    params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} | {a.model} width x{a.width_mult} ({params:,} parameters) | {a.dataset} "
          f"{len(tr_y)} train / {len(te_y)} test at {size}x{size} | threads {torch.get_num_threads()} | amp {a.amp}", flush=True)

    amp = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16")
    budget = a.stop_after_minutes * 60
    train_seconds, step = 0.0, 0
    open(a.log, "w").close()
    for epoch in range(a.epochs):
        order = np.random.RandomState(a.seed * 1000003 + epoch).permutation(len(tr_y))
        loss_sum, correct, seen, stopped = 0.0, 0, 0, False
        t0 = time.time()
        for i in range(0, len(order), a.batch):
            idx = order[i:i + a.batch]
            x, y = make_train(idx), torch.from_numpy(tr_y[idx])
            with amp():
                logits = model(x)
                loss = F.cross_entropy(logits, y, label_smoothing=a.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(idx)
            if budget > 0 and train_seconds + time.time() - t0 >= budget:
                stopped = True
                break
        secs = time.time() - t0
        train_seconds += secs
        t1 = time.time()
        split = "val" if make_val else "test"
        with amp():
            if make_val:
                ev_loss, ev_acc = evaluate(model, va_x, va_y, make_val, 256)
            else:
                ev_loss, ev_acc = evaluate(model, te_x, te_y, make_eval, 256)
        m = {"epoch": epoch + 1, "step": step, "lr": opt.param_groups[0]["lr"], "train_loss": loss_sum / seen,
             "train_acc": correct / seen, f"{split}_loss": ev_loss, f"{split}_acc": ev_acc, "images_per_s": seen / secs,
             "epoch_seconds": secs, "eval_seconds": time.time() - t1, "train_seconds": train_seconds}
        with open(a.log, "a") as f:
            f.write(json.dumps(m) + "\n")
        print(f"epoch {epoch + 1}/{a.epochs}  loss {m['train_loss']:.4f}  train acc {100 * m['train_acc']:5.1f}%  "
              f"{split} acc {100 * ev_acc:5.2f}%  {m['images_per_s']:.0f} img/s  {secs:.1f} s", flush=True)
        if make_val and (best is None or ev_acc > best[0]):  # a tie keeps the earlier epoch, as duet
            best = (ev_acc, epoch + 1, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if stopped or (budget > 0 and train_seconds >= budget):
            print(f"stopped after {train_seconds / 60:.1f} minutes of training", flush=True)
            break
    if best is not None:  # the test split once, with the best epoch's weights
        model.load_state_dict(best[2])
        t1 = time.time()
        with amp():
            test_loss, test_acc = evaluate(model, te_x, te_y, make_eval, 256)
        record = {"test": True, "epoch": best[1], "best_epoch": best[1], "val_acc": best[0], "test_loss": test_loss,
                  "test_acc": test_acc, "test_images": len(te_y), "eval_seconds": time.time() - t1}
        with open(a.log, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"test split (evaluated once, with the weights of epoch {best[1]}, the best on validation at "
              f"{100 * best[0]:.2f}%): accuracy {100 * test_acc:.2f}%  loss {test_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
