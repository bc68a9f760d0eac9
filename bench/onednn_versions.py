#!/usr/bin/env python3
"""Would another oneDNN make duet's convolutions faster? Times resnet18_cifar's convolution layers
(batch 64) on Debian's oneDNN 2.6, which duet links, and on another oneDNN, with the same program
(bench/onednn_conv_algos.cpp, built against each), runs of the two alternated.

For each layer, dtype and pass it takes the fastest variant each library offers (channels-last
direct, blocked direct, blocked Winograd), the way duet's rules pick, and sums them over the
model's layers with their counts: the convolution time of one training step as each library would
give it, before duet's own reorders and matmul paths. Times are the medians over the rounds of
each run's median (the program times 15 runs after 3 warm-ups).

The other library comes from PyPI, into the bench environment (bench/requirements.txt pins
oneDNN 3.2 built with GNU OpenMP, onednn-cpu-gomp and onednn-devel-cpu-gomp), or any prefix with
include/dnnl.hpp and lib/libdnnl.so.3. PyPI's newest oneDNN (the `onednn` and `onednn-devel`
packages) runs on SYCL and TBB; its prefix also needs PyPI's tbb, intel-cmplr-lib-rt and
intel-sycl-rt, and this script points the SYCL CPU device at the prefix's OpenCL runtime.

  .venv-bench/bin/python bench/onednn_versions.py --base build/bench/duet_onednn_conv_algos \\
      --prefix .venv-bench [--rounds 3] [--threads 2] [--json out.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import machine  # noqa: E402  (the machine record every bench result carries)

# resnet18_cifar's convolutions: N C H O K stride, and how many the model has.
RESNET18_CIFAR = [
    ("3 32 64 3 1", 1),  # stem: C=3, 32x32, O=64, 3x3
    ("64 32 64 3 1", 4),
    ("64 32 128 3 2", 1),
    ("64 32 128 1 2", 1),
    ("128 16 128 3 1", 3),
    ("128 16 256 3 2", 1),
    ("128 16 256 1 2", 1),
    ("256 8 256 3 1", 3),
    ("256 8 512 3 2", 1),
    ("256 8 512 1 2", 1),
    ("512 4 512 3 1", 3),
]
PASSES = ("fwd", "bwd-data", "bwd-weights")
LINE = re.compile(r"^\s+(\S+ \S+)\s+fwd\s+([\d.]+) \(\s*\d+\) (\S+)\s+bwd-data\s+([\d.]+) \(\s*\d+\) (\S+)\s+"
                  r"bwd-weights\s+([\d.]+) \(\s*\d+\) (\S+) \+ reorders ([\d.]+)$")
VERSION = re.compile(r"oneDNN (\d+\.\d+\.\d+)")


def fail(msg):
    sys.exit(f"onednn_versions: {msg}")


def build(prefix, tmp):
    """bench/onednn_conv_algos.cpp compiled against the oneDNN in prefix; returns the binary."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onednn_conv_algos.cpp")
    inc, lib = os.path.join(prefix, "include"), os.path.join(prefix, "lib")
    so = os.path.join(lib, "libdnnl.so.3")
    if not os.path.exists(os.path.join(inc, "dnnl.hpp")) or not os.path.exists(so):
        fail(f"{prefix} has no include/dnnl.hpp and lib/libdnnl.so.3 (install onednn-cpu-gomp and "
             "onednn-devel-cpu-gomp into it, see bench/requirements.txt)")
    out = os.path.join(tmp, "onednn_conv_algos_other")
    cmd = ["g++", "-O2", "-std=c++17", "-fopenmp", "-I", inc, src, "-o", out, so, f"-Wl,-rpath,{lib}"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        fail(f"building against {prefix} failed:\n{r.stdout[-3000:]}")
    return out


def environment(prefix, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if prefix:
        lib = os.path.join(prefix, "lib")
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        ocl = os.path.join(lib, "libintelocl.so")
        if os.path.exists(ocl):  # a SYCL build: its CPU device is Intel's OpenCL runtime
            env["OCL_ICD_FILENAMES"] = ocl
    return env


def run(binary, shape, dtype, env):
    """{variant: {pass: (ms, impl)}} and the library version the program printed."""
    cmd = [binary, "64", *shape.split()] + (["bf16"] if dtype == "bf16" else [])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited with {r.returncode}:\n{r.stdout[-2000:]}")
    version = VERSION.search(r.stdout)
    variants = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            g = m.groups()
            variants[g[0]] = {"fwd": (float(g[1]), g[2]), "bwd-data": (float(g[3]), g[4]),
                              "bwd-weights": (float(g[5]), g[6])}
    if not variants:
        fail(f"{' '.join(cmd)} printed no timings:\n{r.stdout[-2000:]}")
    return variants, version.group(1) if version else "?"


def medians(runs):
    """The per-variant, per-pass median over rounds, with the implementation of the first round."""
    out = {}
    for v in runs[0]:
        if all(v in r for r in runs):
            out[v] = {p: (statistics.median(r[v][p][0] for r in runs), runs[0][v][p][1]) for p in PASSES}
    return out


def best(variants, p):
    """The fastest variant for pass p: (ms, variant, impl)."""
    return min((t[p][0], v, t[p][1]) for v, t in variants.items())


def default_dtypes():
    """f32 and bf16 where the CPU has AVX-512, which oneDNN's bf16 convolutions need, else f32. The
    CPU's flag and not duet's backend answers here: the question is about the oneDNN builds compared."""
    return "f32,bf16" if "avx512f" in machine()["isa"] else "f32"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="build/bench/duet_onednn_conv_algos",
                    help="the program built against the oneDNN duet links")
    ap.add_argument("--prefix", help="the other oneDNN: a prefix with include/ and lib/libdnnl.so.3")
    ap.add_argument("--other-binary", help="an already built program to compare instead of --prefix")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", help="f32 and/or bf16 (default: both where the CPU has AVX-512, which oneDNN "
                    "2.6's bf16 kernels need; f32 alone below it)")
    ap.add_argument("--shapes", help="layers as 'C H O K stride:count;...' (default: resnet18_cifar's)")
    ap.add_argument("--json", help="write the per-layer medians and the totals here")
    a = ap.parse_args()
    if bool(a.prefix) == bool(a.other_binary):
        fail("give either --prefix or --other-binary")
    if a.rounds < 1:
        fail("--rounds must be at least 1")
    layers = RESNET18_CIFAR
    if a.shapes:
        try:
            layers = [(s.split(":")[0].strip(), int(s.split(":")[1])) for s in a.shapes.split(";") if s.strip()]
        except (IndexError, ValueError):
            fail(f"--shapes takes 'C H O K stride:count;...', got {a.shapes!r}")
    if a.dtypes is None:
        a.dtypes = default_dtypes()
        if a.dtypes == "f32":
            print("onednn_versions: no AVX-512 on this CPU, so no bf16 convolution in oneDNN 2.6: f32 only")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if any(d not in ("f32", "bf16") for d in dtypes):
        fail(f"--dtypes takes f32 and bf16, got {a.dtypes}")

    with tempfile.TemporaryDirectory() as tmp:
        other = a.other_binary or build(a.prefix, tmp)
        env_base, env_other = environment(None, a.threads), environment(a.prefix, a.threads)
        rows, totals, versions = [], {}, {}
        for dtype in dtypes:
            for shape, count in layers:
                runs = {"base": [], "other": []}
                for _ in range(a.rounds):
                    for side, binary, env in (("base", a.base, env_base), ("other", other, env_other)):
                        variants, versions[side] = run(binary, shape, dtype, env)
                        runs[side].append(variants)
                med = {side: medians(r) for side, r in runs.items()}
                for p in PASSES:
                    b, o = best(med["base"], p), best(med["other"], p)
                    rows.append({"dtype": dtype, "layer": shape, "count": count, "pass": p,
                                 "base_ms": b[0], "base_variant": b[1], "base_impl": b[2],
                                 "other_ms": o[0], "other_variant": o[1], "other_impl": o[2],
                                 "other_over_base": o[0] / b[0]})
                    t = totals.setdefault(dtype, {"base_ms": 0.0, "other_ms": 0.0})
                    t["base_ms"] += count * b[0]
                    t["other_ms"] += count * o[0]

    vb, vo, m = versions["base"], versions["other"], machine()
    print(f"oneDNN {vb} (base) against {vo} (other), batch 64, {a.threads} threads, "
          f"median of {a.rounds} alternated runs; each pass's fastest variant")
    print(f"machine: {m.get('cpu', '?')} (family {m.get('family', '?')} model {m.get('model', '?')}), "
          f"{' '.join(m.get('isa', []))}")
    print(f"{'dtype':5} {'C H O K s':16} {'x':>2} {'pass':11} {'base ms':>8} {'other ms':>8} {'ratio':>6}  "
          f"base kernel -> other kernel")
    for r in rows:
        print(f"{r['dtype']:5} {r['layer']:16} {r['count']:>2} {r['pass']:11} {r['base_ms']:8.3f} {r['other_ms']:8.3f} "
              f"{r['other_over_base']:6.2f}  {r['base_variant']} {r['base_impl']} -> "
              f"{r['other_variant']} {r['other_impl']}")
    for dtype, t in totals.items():
        t["other_over_base"] = t["other_ms"] / t["base_ms"]
        print(f"{dtype}: the layers' convolutions of one step: {t['base_ms']:.1f} ms on {vb}, "
              f"{t['other_ms']:.1f} ms on {vo} ({t['other_over_base']:.2f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": m, "base_version": vb, "other_version": vo, "threads": a.threads, "rounds": a.rounds,
                       "batch": 64, "rows": rows, "totals": totals}, f, indent=1)


if __name__ == "__main__":
    main()
