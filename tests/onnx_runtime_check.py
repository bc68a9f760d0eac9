#!/usr/bin/env python3
"""duet's ONNX exports checked with the tools people will run them with (ctest: onnx.runtime).

For every model of the zoo, at its full size and native input size: tests/onnx_reference.cpp
exports it and computes duet's eval-mode logits on a random batch of 2; here the onnx package's
checker (full_check: strict shape inference too) must accept the file, and ONNX Runtime (CPU) must
reproduce duet's logits on that batch and, the batch dimension being dynamic, on a batch of 1 (the
second image alone). The difference printed and held to 1e-4 is relative to the logits' scale:
max |onnxruntime - duet| / max |duet| over the whole batch. Before the zoo, a checkpoint trained by
`duet train` goes through `duet export --onnx` and its metadata is read back with ONNX Runtime.

Runs in the tests' Python environment (.venv-test, made by scripts/setup_test_env.sh; DUET_TEST_VENV
puts it elsewhere): without it the test reports itself skipped (exit 77), unless
DUET_REQUIRE_TEST_ENV=1 (CI), which makes that a failure. DUET_ONNX_MODELS=name,name limits the
zoo (for a quick look); one model at a time, so the disk holds at most one export.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TOLERANCE = 1e-4
SKIP = 77


def ensure_venv(args):
    """Re-runs this script with the tests' environment's interpreter, or skips (fails) without it."""
    venv = os.path.realpath(os.environ.get("DUET_TEST_VENV") or os.path.join(args.repo, ".venv-test"))
    if os.path.realpath(sys.prefix) == venv:
        return
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        why = (f"the tests' Python environment ({venv}, with onnx and onnxruntime) was not found: make it with "
               "./scripts/setup_test_env.sh, or point DUET_TEST_VENV at one")
        if os.environ.get("DUET_REQUIRE_TEST_ENV") == "1":
            print(f"FAILED: DUET_REQUIRE_TEST_ENV=1, but {why}")
            sys.exit(1)
        print(f"SKIPPED: {why}")
        sys.exit(SKIP)
    sys.stdout.flush()
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


def rel_diff(got, ref):
    import numpy as np
    scale = float(np.max(np.abs(ref)))
    assert scale > 0, "duet's logits are all zero: nothing to compare"
    return float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) / scale


def session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def check_cli_export(duet, tmp):
    """A checkpoint of `duet train` through `duet export --onnx`: the metadata ONNX Runtime reads."""
    import numpy as np
    ck = os.path.join(tmp, "ck.safetensors")
    onnx_path = os.path.join(tmp, "ck.onnx")
    subprocess.run([duet, "train", "--model", "small_cnn", "--dataset", "synthetic", "--classes", "3",
                    "--image-size", "16", "--train-size", "64", "--test-size", "16", "--batch", "32",
                    "--epochs", "1", "--checkpoint", ck], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([duet, "export", "--onnx", onnx_path, "-c", ck], check=True, stdout=subprocess.DEVNULL)
    s = session(onnx_path)
    meta = s.get_modelmeta().custom_metadata_map
    assert json.loads(meta["class_names"]) == ["class0", "class1", "class2"], meta
    assert meta["model"] == "small_cnn" and meta["input_size"] == "16" and meta["num_classes"] == "3", meta
    assert meta["epochs_trained"] == "1" and meta["duet_version"], meta
    batch_dim = s.get_inputs()[0].shape[0]
    assert batch_dim == "batch", f"the input's batch dimension is {batch_dim!r}, expected the symbol 'batch'"
    y = s.run(None, {"input": np.zeros((5, 3, 16, 16), np.float32)})[0]
    assert y.shape == (5, 3), y.shape
    print(f"duet export -c: metadata {sorted(meta)}; batch of 5 -> logits {y.shape}")


def check_model(name, reference, tmp):
    import numpy as np
    import onnx
    t0 = time.time()
    done = subprocess.run([reference, "--model", name, "--out", tmp, "--batch", "2"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise AssertionError(f"{name}: onnx_reference failed:\n{done.stdout}")
    t1 = time.time()
    path = os.path.join(tmp, name + ".onnx")
    onnx.checker.check_model(path, full_check=True)
    header = onnx.load(path, load_external_data=False)
    assert [o.version for o in header.opset_import if o.domain in ("", "ai.onnx")] == [17], header.opset_import
    dim0 = header.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param == "batch" and not dim0.HasField("dim_value"), f"{name}: the batch dimension is fixed"
    meta = {p.key: p.value for p in header.metadata_props}
    assert meta.get("model") == name and meta.get("duet_version"), meta
    bn = sum(n.op_type == "BatchNormalization" for n in header.graph.node)
    del header
    x = np.load(os.path.join(tmp, name + ".input.npy"))
    ref = np.load(os.path.join(tmp, name + ".logits.npy"))
    s = session(path)
    got2 = s.run(None, {"input": x})[0]
    got1 = s.run(None, {"input": x[1:2]})[0]
    del s
    t2 = time.time()
    assert got2.shape == ref.shape and got1.shape == (1, ref.shape[1]), (got2.shape, got1.shape, ref.shape)
    return {"model": name, "classes": ref.shape[1], "bn": bn, "rel2": rel_diff(got2, ref),
            "rel1": rel_diff(got1, ref[1:2]), "duet_s": t1 - t0, "ort_s": t2 - t1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--reference", required=True, help="the onnx_reference program")
    ap.add_argument("--duet", required=True, help="the duet program")
    args = ap.parse_args()
    ensure_venv(args)
    import onnx
    import onnxruntime
    print(f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}; tolerance {TOLERANCE:g} of max |logit|")

    names = subprocess.run([args.reference, "--list"], check=True, text=True, stdout=subprocess.PIPE).stdout.split()
    wanted = [n for n in os.environ.get("DUET_ONNX_MODELS", "").split(",") if n]
    if wanted:
        unknown = sorted(set(wanted) - set(names))
        assert not unknown, f"DUET_ONNX_MODELS names models the zoo does not have: {unknown}"
        names = wanted
    failures = []
    with tempfile.TemporaryDirectory(prefix="duet-onnx-") as tmp:
        check_cli_export(args.duet, tmp)
        print(f"{'model':24} {'classes':>7} {'BN nodes':>8} {'max rel diff, batch 2':>22} {'batch 1':>10}"
              f" {'duet s':>7} {'ORT s':>6}")
        for name in names:
            work = os.path.join(tmp, name)
            os.mkdir(work)
            try:
                r = check_model(name, args.reference, work)
            except Exception as e:  # noqa: BLE001 - every model is tried; each failure is listed
                failures.append(f"{name}: {e}")
                print(f"{name:24} FAILED: {e}", flush=True)
                continue
            finally:
                shutil.rmtree(work, ignore_errors=True)
            worst = max(r["rel2"], r["rel1"])
            if worst > TOLERANCE:
                failures.append(f"{name}: ONNX Runtime's logits differ from duet's by {worst:.2e} of their scale")
            print(f"{name:24} {r['classes']:>7} {r['bn']:>8} {r['rel2']:>22.2e} {r['rel1']:>10.2e}"
                  f" {r['duet_s']:>7.1f} {r['ort_s']:>6.1f}{'  FAILED' if worst > TOLERANCE else ''}", flush=True)
    if failures:
        print(f"FAILED: {len(failures)} of {len(names)} models:\n  " + "\n  ".join(failures))
        return 1
    print(f"all {len(names)} models: ONNX Runtime reproduces duet's logits within {TOLERANCE:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
