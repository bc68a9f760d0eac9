#!/usr/bin/env python3
"""Data-parallel training on one machine: N ranks with T threads each against one process with
N*T threads, the same global batch, from duet's own profiles.

For each model it runs, alternating (A B A B ...) so both see the same machine state:
  one process:  duet --threads N*T train ... --batch N*b --profile one.json
  N ranks:      mpirun -np N duet --threads T train ... --batch b --profile ranks.json  (rank 0's)
on synthetic data (no data pipeline), and reads from the reports:
  - images/s: the median step's; for N ranks the global batch over rank 0's median step (the
    per-step all-reduce of the loss keeps the ranks in lock step);
  - comm exposed: the training thread's comm phase per step (comm.wait, the wait for the buckets
    backward did not hide, plus comm.step_metrics);
  - all-reduce: the buckets' all-reduce time per step on the communication thread (comm.all_reduce)
    and its bus bandwidth (nccl-tests' definition: 2 (N - 1) / N times the buffer over the time);
  - hidden: the part of the all-reduce time that ran while backward was still running
    (all-reduce minus what finish() waited for, at least 0).

  bench/dist_overlap.py --duet build/duet --models resnet18_cifar vit_tiny_p4 \
      --json bench/results/dist_overlap.json

Needs mpirun (./scripts/setup.sh installs Open MPI) and a duet built with MPI. Run it on a quiet
machine: nothing else may compete for the cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODELS = {"resnet18_cifar": 32, "vit_tiny_p4": 32, "mobilenet_v2": 32, "resnet50_cifar": 32, "densenet121": 32,
          "small_cnn": 32, "mlp": 32}


def op_per_step_ns(report, name):
    steps = max(report["phases"]["steps"], 1)
    return sum(r["self_ns"] for r in report["op_records"] if r["name"] == name) / steps


def run(cmd, env):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"dist_overlap: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


def measure(args, model, tmp):
    size = MODELS[model]
    n, t, b = args.ranks, args.threads, args.batch
    common = ["train", "--model", model, "--dataset", "synthetic", "--image-size", str(size), "--classes", "10",
              "--test-size", "16", "--epochs", "1", "--workers", "0", "--log-every", "0"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("OMP_NUM_THREADS", None)
    train_size = str(args.steps * n * b)
    rows = {"one": [], "ranks": []}
    for rep in range(args.repeats):
        one = os.path.join(tmp, f"{model}_one_{rep}.json")
        run([args.duet, "--threads", str(n * t)] + common + ["--batch", str(n * b), "--train-size", train_size,
                                                             "--profile", one], env)
        many = os.path.join(tmp, f"{model}_ranks_{rep}.json")
        run([args.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(n), args.duet, "--threads", str(t)] + common +
            ["--batch", str(b), "--train-size", train_size, "--bucket-mb", str(args.bucket_mb), "--profile", many], env)
        for key, path in (("one", one), ("ranks", many)):
            with open(path) as f:
                rep_json = json.load(f)
            ph = rep_json["phases"]
            step_s = ph["median_step_ns"] / 1e9
            ops = ph["mean_ops_ns"] or {}
            row = {"median_step_ms": step_s * 1e3, "images_per_s": n * b / step_s,
                   "backward_ms": ops.get("backward", 0) / 1e6}
            if key == "ranks":
                all_reduce = op_per_step_ns(rep_json, "comm.all_reduce")
                wait = op_per_step_ns(rep_json, "comm.wait")
                bus_bytes = sum(r["bytes"] for r in rep_json["op_records"] if r["name"] == "comm.all_reduce")
                ar_total = sum(r["self_ns"] for r in rep_json["op_records"] if r["name"] == "comm.all_reduce")
                row.update({"comm_exposed_ms": ops.get("comm", 0) / 1e6, "all_reduce_ms": all_reduce / 1e6,
                            "hidden_ms": max(all_reduce - wait, 0) / 1e6,
                            "bus_gbs": bus_bytes / ar_total if ar_total > 0 else None})
            rows[key].append(row)
    med = lambda key, field: statistics.median(r[field] for r in rows[key])
    out = {"model": model, "image_size": size, "ranks": n, "threads_per_rank": t, "batch_per_rank": b,
           "global_batch": n * b, "one_images_per_s": med("one", "images_per_s"),
           "ranks_images_per_s": med("ranks", "images_per_s"), "one_median_step_ms": med("one", "median_step_ms"),
           "ranks_median_step_ms": med("ranks", "median_step_ms"), "ranks_backward_ms": med("ranks", "backward_ms"),
           "comm_exposed_ms": med("ranks", "comm_exposed_ms"), "all_reduce_ms": med("ranks", "all_reduce_ms"),
           "hidden_ms": med("ranks", "hidden_ms")}
    bus = [r["bus_gbs"] for r in rows["ranks"] if r["bus_gbs"] is not None]
    out["bus_gbs"] = statistics.median(bus) if bus else None
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duet", default="build/duet")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--models", nargs="+", default=["resnet18_cifar", "vit_tiny_p4"], choices=sorted(MODELS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per rank (one process gets ranks * threads)")
    p.add_argument("--batch", type=int, default=32, help="batch per rank (one process gets ranks * batch)")
    p.add_argument("--steps", type=int, default=12, help="steps per run (the median step is taken)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each side")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.models:
            results.append(measure(args, m, tmp))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs; {args.ranks} ranks x {args.threads} threads against 1 process x "
          f"{args.ranks * args.threads} threads; global batch {args.ranks * args.batch}; median of {args.repeats} runs "
          f"of {args.steps} steps")
    print(f"{'model':16} {'1 proc img/s':>12} {'ranks img/s':>12} {'ratio':>6} {'backward ms':>11} {'all-reduce ms':>13} "
          f"{'hidden ms':>9} {'exposed ms':>10} {'bus GB/s':>8}")
    for r in results:
        bus = f"{r['bus_gbs']:.2f}" if r["bus_gbs"] is not None else "n/a"
        print(f"{r['model']:16} {r['one_images_per_s']:12.1f} {r['ranks_images_per_s']:12.1f} "
              f"{r['ranks_images_per_s'] / r['one_images_per_s']:6.2f} {r['ranks_backward_ms']:11.1f} "
              f"{r['all_reduce_ms']:13.2f} {r['hidden_ms']:9.2f} {r['comm_exposed_ms']:10.2f} {bus:>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "logical_cpus": os.cpu_count(), "args": vars(args), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
