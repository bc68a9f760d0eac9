#!/usr/bin/env python3
"""duet's TensorBoard event files read by TensorBoard itself.

  python3 tests/tensorboard_check.py SOURCE_DIR DUET_BINARY OUT_DIR

A short synthetic training run with --tensorboard, --log and --profile, and a `duet profile
--tensorboard`, then, in the tests' Python environment (.venv-test, made by
scripts/setup_test_env.sh; DUET_TEST_VENV puts it elsewhere):
  - every record passes TensorBoard's own record reader (lengths and masked CRC32Cs), and the first
    event carries file_version "brain.Event:2";
  - TensorBoard's EventAccumulator reads every number of every --log line back as epoch/<key> at
    the epoch's step, equal to the log's value as a float32; epoch/step_time_ms is the epoch's
    seconds over its steps; the per-step scalars agree with the log (the epoch's last lr, the mean
    of the step losses, step times adding up to at most the epoch, peaks under the epoch's);
  - the profile/ scalars equal the report's steps (time, images/s, memory peak);
  - the weight and gradient histograms cover every parameter at the steps asked for, and the op
    table, the layer table and the run's config are there as text;
  - `tensorboard --logdir` on a free localhost port answers HTTP and lists the run's tags through
    its data API; then it is stopped.
Without the environment the test is skipped (exit 77), unless DUET_REQUIRE_TEST_ENV=1 (CI).
"""
import glob
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

SKIP = 77
src, duet, out = sys.argv[1], sys.argv[2], sys.argv[3]


def venv_python():
    venv = os.environ.get("DUET_TEST_VENV") or os.path.join(src, ".venv-test")
    return os.path.join(venv, "bin", "python")


def missing_env(why):
    msg = f"tensorboard_check: {why} (./scripts/setup_test_env.sh makes .venv-test with tensorboard)"
    if os.environ.get("DUET_REQUIRE_TEST_ENV") == "1":
        print(msg + "; DUET_REQUIRE_TEST_ENV=1, so this is a failure")
        sys.exit(1)
    print(msg + ": SKIPPED")
    sys.exit(SKIP)


# Run under the tests' environment: re-run this script with its interpreter.
if "--in-venv" not in sys.argv:
    py = venv_python()
    if not os.access(py, os.X_OK):
        missing_env(f"no Python environment at {os.path.dirname(os.path.dirname(py))}")
    if subprocess.run([py, "-c", "import tensorboard"], capture_output=True).returncode != 0:
        missing_env(f"{py} cannot import tensorboard")
    os.execv(py, [py, os.path.abspath(__file__), src, duet, out, "--in-venv"])

import numpy as np  # noqa: E402  (the environment's)
from tensorboard.backend.event_processing import event_accumulator as ea  # noqa: E402
from tensorboard.compat.proto import event_pb2  # noqa: E402
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def f32(x):
    return float(np.float32(x))


def run(args):
    r = subprocess.run([duet, "--threads", "1"] + args, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit(f"tensorboard_check: duet {' '.join(args)} exited with {r.returncode}")
    return r.stdout


def records(path):
    """Every record through TensorBoard's reader, which checks both CRCs of each."""
    reader = pywrap_tensorflow.PyRecordReader_New(path.encode())
    out = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(reader.record())


def event_file(folder):
    files = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    assert len(files) == 1, f"expected one event file in {folder}: {files}"
    return files[0]


def accumulator(folder):
    a = ea.EventAccumulator(folder, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0})
    a.Reload()
    return a


os.makedirs(out, exist_ok=True)
for old in glob.glob(os.path.join(out, "tb*", "events.out.tfevents.*")):
    os.remove(old)

# ---- a training run --------------------------------------------------------------------------------
EVERY = 3
text = run(["train", "--model", "small_cnn", "--dataset", "synthetic", "--epochs", "2", "--train-size", "192",
            "--test-size", "64", "--batch", "32", "--tensorboard", "tb", "--tensorboard-histograms", str(EVERY),
            "--log", "log.jsonl", "--profile", "run.json"])
params = int(re.search(r"model small_cnn \(([\d,]+) parameters", text).group(1).replace(",", ""))
log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
report = json.load(open(os.path.join(out, "run.json")))
path = event_file(os.path.join(out, "tb"))

recs = records(path)
first = event_pb2.Event.FromString(recs[0])
check(first.file_version == "brain.Event:2", f"first event's file_version is {first.file_version!r}")
print(f"records: {len(recs)}, all through TensorBoard's reader (length and data CRC32C checked); "
      f"first event: file_version {first.file_version!r}")

a = accumulator(os.path.join(out, "tb"))
tags = a.Tags()
scalars = {t: {e.step: e.value for e in a.Scalars(t)} for t in tags["scalars"]}

# Every number of every log line, as epoch/<key> at the epoch's step.
compared = 0
prev_step = 0
for line in log:
    step = line["step"]
    for key, value in line.items():
        if key in ("epoch", "step") or isinstance(value, (str, bool)):
            continue
        tag = "epoch/" + key
        got = scalars.get(tag, {}).get(step)
        check(got == f32(value), f"{tag} at step {step}: TensorBoard has {got}, the log {value}")
        compared += 1
    want = f32(line["epoch_seconds"] * 1000.0 / (step - prev_step))
    got = scalars.get("epoch/step_time_ms", {}).get(step)
    check(got == want, f"epoch/step_time_ms at step {step}: {got}, expected {want}")
    compared += 1

    # Per-step scalars against the epoch's line.
    steps = range(prev_step + 1, step + 1)
    losses = [scalars["step/loss"][s] for s in steps]
    check(math.isclose(sum(losses) / len(losses), line["train_loss"], rel_tol=1e-5),
          f"epoch {line['epoch']}: the step losses average {sum(losses) / len(losses)}, the log's train_loss "
          f"{line['train_loss']}")
    check(scalars["step/lr"][step] == f32(line["lr"]), f"step/lr at {step} is not the epoch's lr {line['lr']}")
    # The step times cover the epoch up to its last step; what follows (that step's callbacks, the
    # end of the loop) is short. 100 ms leaves room for a busy machine descheduling the run.
    secs = line["epoch_seconds"]
    tail_ms = secs * 1000 - sum(scalars["step/time_ms"][s] for s in steps)
    check(-1 <= tail_ms <= 100, f"epoch {line['epoch']}: the step times leave {tail_ms} ms of its {secs} s uncovered")
    # The last step's images/s is the epoch's images over the time up to that step.
    ips = scalars["step/images_per_s"][step]
    tail_s = secs * (1 - line["images_per_s"] / ips)
    check(-1e-6 <= tail_s <= 0.1, f"step/images_per_s at {step} is {ips}; the epoch's {line['images_per_s']} "
                                  f"puts the last step {tail_s} s before the epoch's end")
    peak = scalars["step/peak_memory_mib"][step]
    check(0 < peak <= line["peak_memory_bytes"] / 2**20 * (1 + 1e-6),
          f"step/peak_memory_mib at {step} is {peak}; the epoch's peak is {line['peak_memory_bytes']} bytes")
    prev_step = step
last = log[-1]["step"]
for tag in ("step/loss", "step/lr", "step/time_ms", "step/images_per_s", "step/peak_memory_mib"):
    check(sorted(scalars.get(tag, {})) == list(range(1, last + 1)), f"{tag}: steps {sorted(scalars.get(tag, {}))}")
print(f"scalars: {compared} epoch values equal to the JSON log as float32 ({len(log)} epochs x "
      f"{compared // len(log)} keys, epoch/step_time_ms included); {last} steps of step/loss, step/lr, step/time_ms, "
      "step/images_per_s, step/peak_memory_mib agree with their epochs' lines")

# The profile's steps.
device = report["totals"]["device"]
for s in report["steps"]:
    x = s["step"] + 1
    check(scalars["profile/step_time_ms"].get(x) == f32(s["dur_ns"] / 1e6), f"profile/step_time_ms at {x}")
    check(scalars["profile/images_per_s"].get(x) == f32(s["images"] / (s["dur_ns"] / 1e9)), f"profile/images_per_s at {x}")
    mem = [m for m in s["memory"] if m["device"] == device][0]
    check(scalars["profile/peak_memory_mib"].get(x) == f32(mem["peak"] / 2**20), f"profile/peak_memory_mib at {x}")
print(f"profile: {len(report['steps'])} steps' time, images/s and memory peak equal to run.json")

# Histograms: every parameter, weights and gradients, at every EVERY-th step and each epoch's end.
weights = sorted(t for t in tags["histograms"] if t.startswith("weights/"))
grads = sorted(t for t in tags["histograms"] if t.startswith("gradients/"))
check(len(weights) > 0 and [w[len("weights/"):] for w in weights] == [g[len("gradients/"):] for g in grads],
      f"weights {weights} vs gradients {grads}")
want_steps = sorted(set(range(EVERY, last + 1, EVERY)) | {line["step"] for line in log})
for t in weights + grads:
    hs = a.Histograms(t)
    check([h.step for h in hs] == want_steps, f"{t}: histograms at {[h.step for h in hs]}, expected {want_steps}")
    for h in hs:
        v = h.histogram_value
        check(v.num > 0 and sum(v.bucket) == v.num and v.min <= v.max, f"{t} at {h.step}: {v}")
numbers = sum(a.Histograms(t)[0].histogram_value.num for t in weights)
check(numbers == params, f"the weight histograms hold {numbers} values; the model has {params} parameters")
print(f"histograms: {len(weights)} weights/ and {len(grads)} gradients/ tags at steps {want_steps}; "
      f"{int(numbers)} values = the model's {params} parameters")

texts = {t: a.Tensors(t)[-1].tensor_proto.string_val[0].decode() for t in tags["tensors"]}
for t in ("run/config", "profile/op_table", "profile/layer_table", "profile/steps_and_memory"):
    check(t in texts, f"text {t} missing (have {sorted(texts)})")
top = report["op_table"][0]["key"]
check(top in texts.get("profile/op_table", ""), f"the op table text does not name the top op {top}")
check('"small_cnn"' in texts.get("run/config", ""), "run/config does not name the model")
print(f"text: {sorted(texts)}; the op table names the top op {top!r}")

# ---- duet profile --tensorboard ----------------------------------------------------------------------
run(["profile", "--model", "mlp", "--batch", "16", "--steps", "3", "--warmup", "1", "--out", "prof.json",
     "--tensorboard", "tb_profile"])
prof = json.load(open(os.path.join(out, "prof.json")))
recs_p = records(event_file(os.path.join(out, "tb_profile")))
b = accumulator(os.path.join(out, "tb_profile"))
ptimes = {e.step: e.value for e in b.Scalars("profile/step_time_ms")}
check(ptimes == {s["step"] + 1: f32(s["dur_ns"] / 1e6) for s in prof["steps"]}, f"duet profile's step times {ptimes}")
check("profile/op_table" in b.Tags()["tensors"] and len(b.Tags()["histograms"]) > 0, f"duet profile's tags {b.Tags()}")
print(f"duet profile --tensorboard: {len(recs_p)} records; step times equal to prof.json; op table and "
      f"{len(b.Tags()['histograms'])} histograms")

# ---- TensorBoard itself, on localhost ------------------------------------------------------------------
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
tb_bin = os.path.join(os.path.dirname(sys.executable), "tensorboard")
server = subprocess.Popen([tb_bin, "--logdir", os.path.join(out, "tb"), "--host", "127.0.0.1", "--port", str(port),
                           "--load_fast", "false", "--reload_interval", "1"],
                          stdout=open(os.path.join(out, "tensorboard.log"), "w"), stderr=subprocess.STDOUT)


def get(route):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{route}", timeout=5) as r:
        return r.status, r.read()


try:
    deadline = time.time() + 90
    listed = None
    while time.time() < deadline:
        check(server.poll() is None, f"tensorboard exited with {server.returncode}; see tensorboard.log")
        if server.poll() is not None:
            break
        try:
            status, body = get("/data/plugin/scalars/tags")
            runs = json.loads(body)
            if runs and any("epoch/train_loss" in t for t in runs.values()):
                listed = runs
                break
        except OSError:
            pass
        time.sleep(0.5)
    check(listed is not None, f"tensorboard on port {port} did not list the run's scalar tags within 90 s")
    if listed:
        run_name, scalar_tags = next(iter(listed.items()))
        status, home = get("/")
        check(status == 200 and b"<html" in home.lower(), "tensorboard's page did not answer")
        hist = json.loads(get("/data/plugin/histograms/tags")[1]).get(run_name, {})
        txt = json.loads(get("/data/plugin/text/tags")[1]).get(run_name, [])
        series = json.loads(get("/data/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": run_name, "tag": "epoch/train_loss"}))[1])
        check(set(scalar_tags) == set(tags["scalars"]), f"tensorboard lists scalars {sorted(scalar_tags)}")
        check(set(hist) == set(tags["histograms"]), "tensorboard lists other histogram tags")
        check(set(txt) == set(texts), f"tensorboard lists text tags {txt}")
        check([(p[1], p[2]) for p in series] == [(line["step"], f32(line["train_loss"])) for line in log],
              f"tensorboard's epoch/train_loss series {series}")
        print(f"tensorboard {subprocess.run([tb_bin, '--version_tb'], capture_output=True, text=True).stdout.strip()} "
              f"on http://127.0.0.1:{port}: HTTP 200; run {run_name!r}: {len(scalar_tags)} scalar, {len(hist)} "
              f"histogram and {len(txt)} text tags; epoch/train_loss series equal to the log")
finally:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
print("tensorboard stopped")

if failures:
    sys.exit(f"tensorboard_check: {len(failures)} failure(s)")
print("tensorboard_check: ok")
