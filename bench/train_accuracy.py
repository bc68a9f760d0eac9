#!/usr/bin/env python3
"""Accuracy versus training time, duet beside PyTorch, on the same recipe and the same 2 threads:

  cifar10  resnet18_cifar at half width (32 channels), 18 epochs, CIFAR-10 data_batch_1.bin (10,000
           images) -> test_batch.bin, target 75% within 10 minutes of training
  catdog   resnet18 at half width from scratch on cats_dogs/train (1,000 photos) at 128x128 (the
           model zoo's cat/dog setting), 80 epochs -> cats_dogs/test, target 80% within 10 minutes
           (at 64x64 both frameworks ended near 77%: too little detail; 128 px costs 4x per image)

Recipe for both frameworks: SGD with Nesterov momentum 0.9, weight decay 5e-4, one-cycle learning
rate (cosine up for 30% of the steps, then down), label smoothing 0.1, random crop + flip
(CIFAR-10: pad 4 and crop 32; cat/dog: random-resized crop of at least 35% of the area at 128x128).
Each run stops at the time budget (training time only: evaluation after every epoch is not
counted). --val-fraction (default 0.1) holds the same stratified part of the training set out in
both frameworks (duet's split, drawn from --seed): every epoch is evaluated on it, the best epoch is
chosen on it, and the test split is evaluated once, at the end, with that epoch's weights; so the
curves and the "minutes to target" are validation accuracy, and the test accuracy is one number per
run that was not used to choose anything. --val-fraction 0 gives the old runs (test split after
every epoch). PyTorch runs bench/torch_train.py with --python, by default the benchmarks' environment
.venv-bench (scripts/setup_bench.sh). One difference in what
is timed: PyTorch decodes the cat/dog photos before training starts (not counted), duet decodes
them in its loader's workers during the first epoch (counted).

Writes to --out: <framework>_<task>.jsonl (one line per epoch, then the test record), train_accuracy.csv
(all curves), train_accuracy.png (accuracy versus minutes), summary.json; prints a summary table.

  .venv-bench/bin/python bench/train_accuracy.py --duet build/duet            # the full benchmark (~50 min)
  .venv-bench/bin/python bench/train_accuracy.py --duet build/duet --minutes 1 --tasks cifar10   # a quick check
  .venv-bench/bin/python bench/train_accuracy.py --plot-only                  # redraw from existing logs

The plot needs matplotlib (in .venv-bench); without it the CSV and the table are still written.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# What each task trains; both frameworks get exactly these settings.
TASKS = {
    "cifar10": dict(dataset="cifar10", data="cifar10", model="resnet18_cifar", width_mult=0.5, image_size=32,
                    epochs=18, batch=128, lr=0.2, target=0.75, augment=dict(crop_padding=4)),
    "catdog": dict(dataset="folder", data="cats_dogs", model="resnet18", width_mult=0.5, image_size=128,
                   epochs=80, batch=64, lr=0.1, target=0.80, augment=dict(scale_min=0.35)),
}
COMMON = dict(momentum=0.9, weight_decay=5e-4, label_smoothing=0.1, pct_start=0.3)


def duet_command(a, task, t, log, checkpoint):
    cmd = [a.duet, "train", "--model", t["model"], "--width-mult", str(t["width_mult"]), "--dataset", t["dataset"],
           "--data", os.path.join(a.data, t["data"]), "--image-size", str(t["image_size"]), "--epochs", str(t["epochs"]),
           "--batch", str(t["batch"]), "--optimizer", "sgd", "--lr", str(t["lr"]), "--momentum", str(COMMON["momentum"]),
           "--nesterov", "--weight-decay", str(COMMON["weight_decay"]), "--label-smoothing",
           str(COMMON["label_smoothing"]), "--schedule", "onecycle", "--pct-start", str(COMMON["pct_start"]), "--flip",
           "--threads", str(a.threads), "--seed", str(a.seed), "--stop-after-minutes", str(a.minutes), "--log", log,
           "--checkpoint", checkpoint, "--log-every", "20", "--amp", a.amp]
    if a.val_fraction > 0:
        cmd += ["--val-fraction", str(a.val_fraction)]
    if "crop_padding" in t["augment"]:
        cmd += ["--crop-padding", str(t["augment"]["crop_padding"])]
    if "scale_min" in t["augment"]:
        cmd += ["--scale-min", str(t["augment"]["scale_min"])]
    return cmd, dict(os.environ)


def torch_command(a, task, t, log):
    cmd = [a.python, os.path.join(HERE, "torch_train.py"), "--dataset", t["dataset"], "--data",
           os.path.join(a.data, t["data"]), "--model", t["model"], "--width-mult", str(t["width_mult"]), "--image-size",
           str(t["image_size"]), "--epochs", str(t["epochs"]), "--batch", str(t["batch"]), "--lr", str(t["lr"]),
           "--momentum", str(COMMON["momentum"]), "--weight-decay", str(COMMON["weight_decay"]), "--label-smoothing",
           str(COMMON["label_smoothing"]), "--pct-start", str(COMMON["pct_start"]), "--threads", str(a.threads),
           "--seed", str(a.seed), "--stop-after-minutes", str(a.minutes), "--log", log, "--amp", a.amp,
           "--val-fraction", str(a.val_fraction)]
    if "crop_padding" in t["augment"]:
        cmd += ["--crop-padding", str(t["augment"]["crop_padding"])]
    if "scale_min" in t["augment"]:
        cmd += ["--scale-min", str(t["augment"]["scale_min"])]
    env = dict(os.environ)
    # These tune Debian's OpenBLAS for this machine; PyTorch's wheel brings its own BLAS and must not see them.
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return cmd, env


def read_log(path):
    """(epoch rows, the test record or None). Each epoch row gets "split" and "acc"/"loss": its evaluation,
    on the validation split (runs with --val-fraction) or on the test split (older runs)."""
    if not os.path.exists(path):
        return [], None
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in lines if not r.get("test") is True]
    for r in rows:
        r["split"] = "val" if "val_acc" in r else "test"
        r["acc"], r["loss"] = r[r["split"] + "_acc"], r[r["split"] + "_loss"]
    return rows, next((r for r in lines if r.get("test") is True), None)


def summarize(framework, task, rows, test, target):
    s = dict(framework=framework, task=task, epochs=len(rows), target=target)
    if not rows:
        return s
    best = max(rows, key=lambda r: r["acc"])
    hit = next((r for r in rows if r["acc"] >= target), None)
    s.update(eval_split=rows[-1]["split"], final_acc=rows[-1]["acc"], best_acc=best["acc"], best_epoch=best["epoch"],
             train_minutes=rows[-1]["train_seconds"] / 60, minutes_to_target=hit["train_seconds"] / 60 if hit else None,
             images_per_s=sum(r["images_per_s"] * r["epoch_seconds"] for r in rows) / max(
                 sum(r["epoch_seconds"] for r in rows), 1e-9))
    if test is not None:  # the test split, once, with the best epoch on validation's weights
        s.update(test_acc=test["test_acc"], test_loss=test["test_loss"], test_epoch=test["epoch"])
    return s


def plot(a, curves, summaries):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (it is in .venv-bench: scripts/setup_bench.sh): no PNG written")
        return None
    tasks = [t for t in a.tasks if any(k[1] == t for k in curves)]
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(6 * max(len(tasks), 1), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for fw, style in (("duet", "o-"), ("torch", "s--")):
            rows = curves.get((fw, task), [])
            if rows:
                name = "duet" if fw == "duet" else "PyTorch"
                ax.plot([r["train_seconds"] / 60 for r in rows], [100 * r["acc"] for r in rows], style,
                        label=f"{name} ({rows[-1]['split']})", markersize=4)
                s = next((x for x in summaries if x["framework"] == fw and x["task"] == task), {})
                if "test_acc" in s:  # the one test number, at the end of the run
                    ax.plot([s["train_minutes"]], [100 * s["test_acc"]], "*", markersize=11, color=ax.lines[-1].get_color(),
                            label=f"{name} test (epoch {s['test_epoch']})")
        ax.axhline(100 * TASKS[task]["target"], color="grey", lw=0.8, ls=":")
        ax.axvline(a.minutes, color="grey", lw=0.8, ls=":")
        t = TASKS[task]
        ax.set_title(f"{task}: {t['model']} x{t['width_mult']} at {t['image_size']}px, batch {t['batch']}")
        ax.set_xlim(left=0)
        ax.set_xlabel("training time (minutes, evaluation excluded)")
        ax.set_ylabel("accuracy (%): validation per epoch, test once")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = os.path.join(a.out, "train_accuracy.png")
    fig.savefig(path, dpi=120)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default=os.path.join(ROOT, "build", "duet"), help="the duet binary")
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv-bench", "bin", "python"),
                    help="Python with PyTorch and Pillow (default: .venv-bench, made by scripts/setup_bench.sh)")
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"), help="folder with cifar10/ and cats_dogs/")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "train_accuracy"))
    ap.add_argument("--tasks", default="cifar10,catdog")
    ap.add_argument("--frameworks", default="duet,torch")
    ap.add_argument("--minutes", type=float, default=10.0, help="training-time budget of each run")
    ap.add_argument("--set", action="append", default=[], metavar="TASK:KEY=VALUE",
                    help="change a recipe setting for both frameworks, e.g. cifar10:epochs=8 or cifar10:width_mult=0.25 "
                         "(keys: model width_mult image_size epochs batch lr)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"],
                    help="mixed precision: duet train --amp, and for PyTorch torch.autocast (bf16 only: fp16 on the CPU "
                         "would need a gradient scaler the PyTorch script does not have); e.g. --amp bf16 --out DIR "
                         "to put bf16 runs beside f32 ones")
    ap.add_argument("--val-fraction", type=float, default=0.1,
                    help="validation split held out of the training set in both frameworks (duet's, from --seed): "
                         "epochs are evaluated and the best chosen on it, the test split once at the end; 0: the test "
                         "split after every epoch, as before")
    ap.add_argument("--plot-only", action="store_true", help="no training: summarise and plot the logs in --out")
    a = ap.parse_args()
    a.tasks = [t for t in a.tasks.split(",") if t]
    frameworks = [f for f in a.frameworks.split(",") if f]
    for t in a.tasks:
        if t not in TASKS:
            sys.exit(f"unknown task '{t}': expected {', '.join(TASKS)}")
    for f in frameworks:
        if f not in ("duet", "torch"):
            sys.exit(f"unknown framework '{f}': expected duet, torch")
    if a.amp == "fp16" and "torch" in frameworks:
        sys.exit("--amp fp16 is duet's only: the PyTorch side runs off or bf16 (pass --frameworks duet)")
    for setting in a.set:
        try:
            task, kv = setting.split(":", 1)
            key, value = kv.split("=", 1)
        except ValueError:
            sys.exit(f"--set {setting}: expected TASK:KEY=VALUE, e.g. cifar10:epochs=8")
        if task not in TASKS or key not in ("model", "width_mult", "image_size", "epochs", "batch", "lr"):
            sys.exit(f"--set {setting}: expected a task in {', '.join(TASKS)} and a key in model, width_mult, "
                     "image_size, epochs, batch, lr")
        TASKS[task][key] = value if key == "model" else type(TASKS[task][key])(value)
    os.makedirs(a.out, exist_ok=True)

    if not a.plot_only:
        for task in a.tasks:
            t = TASKS[task]
            for fw in frameworks:
                log = os.path.join(a.out, f"{fw}_{task}.jsonl")
                if os.path.exists(log):
                    os.remove(log)  # duet appends to its log
                if fw == "duet":
                    if not os.access(a.duet, os.X_OK):
                        sys.exit(f"duet binary '{a.duet}' not found: build it (cmake --build build) or pass --duet")
                    cmd, env = duet_command(a, task, t, log, os.path.join(a.out, f"duet_{task}.safetensors"))
                else:
                    cmd, env = torch_command(a, task, t, log)
                print(f"\n=== {task} / {fw}: {' '.join(cmd)}", flush=True)
                t0 = time.time()
                with open(os.path.join(a.out, f"{fw}_{task}.out.txt"), "w") as out:
                    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    for line in p.stdout:
                        sys.stdout.write(line)
                        out.write(line)
                    p.wait()
                print(f"=== {task} / {fw}: exit {p.returncode}, {(time.time() - t0) / 60:.1f} minutes wall", flush=True)
                if p.returncode != 0:
                    print(f"warning: {fw} on {task} failed; its curve may be missing", flush=True)

    curves, summaries = {}, []
    with open(os.path.join(a.out, "train_accuracy.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["framework", "task", "epoch", "train_seconds", "split", "acc", "loss", "train_loss", "train_acc",
                    "images_per_s"])
        for task in a.tasks:
            for fw in ("duet", "torch"):
                rows, test = read_log(os.path.join(a.out, f"{fw}_{task}.jsonl"))
                if not rows:
                    continue
                curves[(fw, task)] = rows
                summaries.append(summarize(fw, task, rows, test, TASKS[task]["target"]))
                for r in rows:
                    w.writerow([fw, task, r["epoch"], f"{r['train_seconds']:.2f}", r["split"], f"{r['acc']:.4f}",
                                f"{r['loss']:.4f}", f"{r['train_loss']:.4f}", f"{r['train_acc']:.4f}",
                                f"{r['images_per_s']:.1f}"])
                if test is not None:
                    w.writerow([fw, task, test["epoch"], "", "test", f"{test['test_acc']:.4f}", f"{test['test_loss']:.4f}",
                                "", "", ""])
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(dict(minutes=a.minutes, threads=a.threads, val_fraction=a.val_fraction,
                       tasks={k: TASKS[k] for k in a.tasks}, common=COMMON, results=summaries), f, indent=1)
    png = plot(a, curves, summaries)

    print(f"\n{'task':8} {'framework':9} {'epochs':>6} {'train min':>9} {'img/s':>7} {'split':>5} {'final acc':>9} "
          f"{'best acc (epoch)':>16} {'min to target':>13} {'test acc, once':>14}")
    for s in summaries:
        if s["epochs"] == 0:
            continue
        hit = f"{s['minutes_to_target']:.1f}" if s["minutes_to_target"] is not None else "not reached"
        test = f"{100 * s['test_acc']:.2f}%" if "test_acc" in s else "-"
        best = f"{100 * s['best_acc']:.2f}% ({s['best_epoch']})"
        print(f"{s['task']:8} {s['framework']:9} {s['epochs']:6d} {s['train_minutes']:9.1f} {s['images_per_s']:7.0f} "
              f"{s['eval_split']:>5} {100 * s['final_acc']:8.2f}% {best:>16} {hit:>13} {test:>14}"
              f"  (target {100 * s['target']:.0f}% on {s['eval_split']})")
    print(f"\ncurves: {os.path.join(a.out, 'train_accuracy.csv')}" + (f"; plot: {png}" if png else ""))


if __name__ == "__main__":
    main()
