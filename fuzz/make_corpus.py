#!/usr/bin/env python3
"""Writes the fuzzers' tiny seed corpora (fuzz/corpus/<target>/) of safetensors files,
checkpoints and CIFAR-10 records: valid inputs, small enough that a mutation reaches every field.
The other seeds were made once by hand: image/ holds 8x6 JPEGs and PNGs written with
stb_image_write (and one with its SOF0 marker changed to SOF2, progressive), and report/ a
`duet profile --model small_cnn --width-mult 0.25 --image-size 8 --batch 2 --steps 1` report with
every list cut to three entries."""
import json, os, struct, sys

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*v):
    return struct.pack(f"<{len(v)}f", *v)


def write(target, name, blob):
    with open(os.path.join(here, target, name), "wb") as f:
        f.write(blob)


write("safetensors", "two_tensors", safetensors({"w": ("F32", [2, 2], f32(1, 2, 3, 4)), "b": ("I64", [1], struct.pack("<q", 7))},
                                                {"note": "seed"}))
write("safetensors", "dtypes", safetensors({"h": ("F16", [2], b"\x00\x3c\x00\x40"), "bf": ("BF16", [1], b"\x80\x3f"),
                                            "u": ("U8", [3], b"abc"), "i": ("I32", [1], b"\x01\x00\x00\x00"),
                                            "d": ("F64", [0], b"")}))
config = {"model": {"name": "small_cnn"}, "epochs": 2, "class_names": ["a", "b"]}
meta = {"format": "duet.checkpoint/1", "epoch": "1", "step": "4", "generator_seed": "7", "generator_offset": "12",
        "config": json.dumps(config), "metrics": json.dumps({"test_acc": 0.5, "train_seconds": 1.5})}
opt = {"optimizer.steps": ("I64", [], struct.pack("<q", 4)),
       "optimizer.state.0.momentum_buffer": ("F32", [2, 3], f32(*[0.1] * 6)),
       "optimizer.state.0.exp_avg": ("F32", [2, 3], f32(*[0.1] * 6)),
       "optimizer.state.0.exp_avg_sq": ("F32", [2, 3], f32(*[0.1] * 6)),
       "optimizer.state.0.step": ("I64", [], struct.pack("<q", 4)),
       "optimizer.state.1.momentum_buffer": ("F32", [3], f32(0, 0, 0))}
write("checkpoint", "sgd_adam_state", safetensors({"model.w": ("F32", [2, 3], f32(*[1.0] * 6)), **opt}, meta))
partial = dict(meta, partial_epoch=json.dumps({"batch": 2, "loss_sum": 3.5, "correct": 10, "seen": 64, "seconds": 0.5,
                                               "skipped_before": 0}),
               grad_scaler=json.dumps({"scale": 65536.0, "growth_tracker": 3, "skipped_steps": 1}))
write("checkpoint", "partial_epoch", safetensors({"model.w": ("F32", [2, 3], f32(*[1.0] * 6)),
                                                  "optimizer.steps": ("I64", [], struct.pack("<q", 0))}, partial))
record = bytes([3]) + bytes(range(256)) * 12
write("cifar", "two_records", record + bytes([9]) + bytes(3072))
write("cifar", "one_record", record)
if len(sys.argv) > 1:
    print("wrote", here)
