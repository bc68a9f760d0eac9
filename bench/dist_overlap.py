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

With --torch (run it with .venv-bench/bin/python), PyTorch runs the same comparison in the same
run, alternating with duet: one process with N*T threads against DistributedDataParallel on N
processes with T threads each (gloo over loopback, bucket_cap_mb as --bucket-mb), same model
(bench/train_throughput.py's definitions), global batch, SGD and memory format (channels-last for
the conv nets), median step after 3 warm-up steps on one fixed random batch. The table then gives
duet's images/s over PyTorch's for one process and for N ranks.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODELS = {"resnet18_cifar": 32, "vit_tiny_p4": 32, "mobilenet_v2": 32, "resnet50_cifar": 32, "densenet121": 32}


def torch_worker(a):
    """One PyTorch process: prints {"median_step_ms": ...} on rank 0."""
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_throughput import time_torch_steps, torch_model
    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    size = MODELS[a.model]
    fmt = torch.contiguous_format if a.model.startswith("vit") else torch.channels_last
    model = torch_model(a.model, 10, size).to(memory_format=fmt).train()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    x = torch.randn(a.batch, 3, size, size).contiguous(memory_format=fmt)
    y = torch.arange(a.batch) % 10
    times = time_torch_steps(model, x, y, 3, a.steps)
    if world > 1:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"median_step_ms": statistics.median(times) * 1e3}))


def torch_step_ms(args, model, ranks, threads, batch):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--model", model, "--threads", str(threads),
           "--batch", str(batch), "--steps", str(args.steps), "--bucket-mb", str(args.bucket_mb)]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE=str(ranks))
    env.pop("OMP_NUM_THREADS", None)
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(ranks)]
    outs = [p.communicate()[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode != 0:
            sys.exit(f"dist_overlap: PyTorch {model} on {ranks} processes failed ({p.returncode}):\n{o[-3000:]}")
    return json.loads(outs[0].strip().splitlines()[-1])["median_step_ms"]


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
    rows = {"one": [], "ranks": [], "torch_one": [], "torch_ranks": []}
    for rep in range(args.repeats):
        if args.torch:
            rows["torch_one"].append(n * b / (torch_step_ms(args, model, 1, n * t, n * b) / 1e3))
            rows["torch_ranks"].append(n * b / (torch_step_ms(args, model, n, t, b) / 1e3))
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
    if args.torch:
        out["torch_one_images_per_s"] = statistics.median(rows["torch_one"])
        out["torch_ranks_images_per_s"] = statistics.median(rows["torch_ranks"])
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
    p.add_argument("--torch", action="store_true", help="also PyTorch: one process against DDP, in the same run")
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_worker:
        return torch_worker(args)
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
    if args.torch:
        print(f"\nagainst PyTorch {__import__('torch').__version__} (DistributedDataParallel, gloo), same run: images/s")
        print(f"{'model':16} {'torch 1 proc':>12} {'torch DDP':>10} {'DDP/1':>6} {'duet/torch 1 proc':>17} "
              f"{'duet/torch ranks':>16}")
        for r in results:
            print(f"{r['model']:16} {r['torch_one_images_per_s']:12.1f} {r['torch_ranks_images_per_s']:10.1f} "
                  f"{r['torch_ranks_images_per_s'] / r['torch_one_images_per_s']:6.2f} "
                  f"{r['one_images_per_s'] / r['torch_one_images_per_s']:17.2f} "
                  f"{r['ranks_images_per_s'] / r['torch_ranks_images_per_s']:16.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "logical_cpus": os.cpu_count(), "args": vars(args), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
