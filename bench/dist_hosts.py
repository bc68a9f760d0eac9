#!/usr/bin/env python3
"""Communication between machines, measured on one: two hosts made of network namespaces
(scripts/hosts.sh, one CPU each), one rank on each, the link between them unthrottled and throttled
to 10 and 1 Gbit/s with tc (tbf). For each link, in the same run:

  - MPI's own ping-pong and all-reduce between the two hosts (bench/mpi_bandwidth.cpp, no duet):
    one-way latency, and the all-reduce's bus bandwidth at each size;
  - duet training resnet18_cifar data-parallel across the hosts (synthetic data, batch 32 per rank)
    with gradient buckets of 25 MB and of 4 MB, profiled: from rank 0's report the median step,
    backward, the buckets' all-reduce time per step and its bus bandwidth (comm.all_reduce), and the
    exposed communication per step (the training thread's comm phase: what backward did not hide);
  - the exposed time bench/dist_cost_model.py predicts from the MPI program's latency and bandwidth
    and duet's backward time: its original formula, max(T - backward, T / k), and the corrected one
    (exposed_s), which queues the buckets behind one another as they become ready during backward.

    python3 bench/dist_hosts.py --duet build/duet --mpi-bench build/bench/duet_mpi_bandwidth \\
        --json bench/results/dist_hosts.json

Needs root (network namespaces) and Open MPI; brings the hosts up and always down. Run it on a
quiet machine: the load average before and after is recorded with the results.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from train_throughput import machine  # noqa: E402  (the machine record every bench result carries)
import dist_cost_model as cm  # noqa: E402

HOSTS = os.path.join(REPO, "scripts", "hosts.sh")
PARAMS = {"resnet18_cifar": 11173962}  # f32 gradients: 4 bytes each (`duet models`)


def predict(row):
    """The model's exposed time for a measured row (from its own MPI figures and backward)."""
    size, k = row["gradient_mb"] * 1e6, row["buckets"]
    bw, lat, b = row["mpi_bus_gbs"] * 1e9, row["mpi_latency_us"] / 1e6, row["backward_ms"] / 1e3
    T = cm.all_reduce_s(2, size, k, bw, lat)
    row["predicted_all_reduce_ms"] = T * 1e3
    row["predicted_exposed_ms_original"] = cm.exposed_s_original(T, b, k) * 1e3
    # Corrected: the buckets queued as they become ready, at the bandwidth duet's all-reduce got while
    # the rank trained (its profile's bus bandwidth), not the MPI program's alone.
    row["predicted_exposed_ms"] = cm.exposed_s(2, [size / k] * k, b, (row["bus_gbs"] or row["mpi_bus_gbs"]) * 1e9, lat) * 1e3
    return row


def sh(cmd, timeout=900, check=True):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and r.returncode != 0:
        sys.exit(f"dist_hosts: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def mpi_bench(args):
    out = sh([HOSTS, "mpirun", "-np", "2", "--map-by", "ppr:1:node", "--bind-to", "none", args.mpi_bench,
              "--max-mb", str(args.max_mb), "--seconds", str(args.seconds)])
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    setup = next(r for r in rows if r["kind"] == "setup")
    assert setup["rank0_host"] != setup["peer_host"], f"both ranks on one host: {setup}"
    return {"pingpong": [r for r in rows if r["kind"] == "pingpong"], "allreduce": [r for r in rows if r["kind"] == "allreduce"],
            "hosts": [setup["rank0_host"], setup["peer_host"]]}


def op_total(report, name, key):
    return sum(r[key] for r in report["op_records"] if r["name"] == name)


def duet_run(args, model, bucket_mb, tmp):
    prof = os.path.join(tmp, "run.json")
    sh([HOSTS, "mpirun", "-np", "2", "--map-by", "ppr:1:node", "--bind-to", "none", args.duet, "train", "--model", model,
        "--dataset", "synthetic", "--image-size", "32", "--classes", "10", "--batch", str(args.batch), "--train-size",
        str(args.steps * 2 * args.batch), "--test-size", "16", "--epochs", "1", "--workers", "0", "--log-every", "0",
        "--bucket-mb", str(bucket_mb), "--profile", prof])
    with open(prof) as f:
        rep = json.load(f)
    ph = rep["phases"]
    steps = max(ph["steps"], 1)
    ops = ph["mean_ops_ns"] or {}
    ar_ns = op_total(rep, "comm.all_reduce", "self_ns")
    calls = sum(r.get("calls", r.get("count", 0)) for r in rep["op_records"] if r["name"] == "comm.all_reduce")
    return {"median_step_ms": ph["median_step_ns"] / 1e6, "backward_ms": ops.get("backward", 0) / 1e6,
            "forward_ms": ops.get("forward", 0) / 1e6, "exposed_ms": ops.get("comm", 0) / 1e6,
            "all_reduce_ms": ar_ns / steps / 1e6, "all_reduce_calls_per_step": calls / steps if calls else None,
            "bus_gbs": op_total(rep, "comm.all_reduce", "bytes") / ar_ns if ar_ns else None}


def bandwidth_at(allreduce, nbytes):
    """The MPI all-reduce's bus bandwidth at the size nearest `nbytes` (bytes/s)."""
    best = min(allreduce, key=lambda r: abs(r["bytes"] - nbytes))
    return best["bus_gbs"] * 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duet", default="build/duet")
    p.add_argument("--mpi-bench", default="build/bench/duet_mpi_bandwidth")
    p.add_argument("--model", default="resnet18_cifar", choices=sorted(PARAMS))
    p.add_argument("--rates", nargs="+", default=["off", "10gbit", "1gbit"], help="tc tbf rates; off: unthrottled")
    p.add_argument("--buckets", nargs="+", type=float, default=[25.0, 4.0], help="--bucket-mb values")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2, help="duet runs per link and bucket size (the median taken)")
    p.add_argument("--max-mb", type=float, default=64)
    p.add_argument("--seconds", type=float, default=0.5, help="time per size in the MPI program")
    p.add_argument("--json")
    p.add_argument("--predict-only", action="store_true", help="recompute the predictions of --json's rows, measure nothing")
    args = p.parse_args()
    if args.predict_only:
        with open(args.json) as f:
            d = json.load(f)
        d["rows"] = [predict(r) for r in d["rows"]]
        with open(args.json, "w") as f:
            json.dump(d, f, indent=1)
        for r in d["rows"]:
            print(f"{r['rate']:>7} {r['bucket_mb']:g} MB: exposed {r['exposed_ms']:.0f} ms, predicted {r['predicted_exposed_ms_original']:.0f} "
                  f"(table's formula) / {r['predicted_exposed_ms']:.0f} ms (queued, duet's bandwidth)")
        return
    for path in (args.duet, args.mpi_bench):
        if not os.access(path, os.X_OK):
            sys.exit(f"dist_hosts: {path} not found: build duet first")

    def down(*_):
        subprocess.run([HOSTS, "down"])
        sys.exit(130)

    signal.signal(signal.SIGINT, down)
    signal.signal(signal.SIGTERM, down)
    load_before = loadavg()
    sh([HOSTS, "up", "2", "--cpus-per-host", "1"])
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rate in args.rates:
                sh([HOSTS, "throttle", rate])
                net = mpi_bench(args)
                latency = min(r["seconds"] for r in net["pingpong"])
                size = 4 * PARAMS[args.model]
                for bucket in args.buckets:
                    runs = [duet_run(args, args.model, bucket, tmp) for _ in range(args.repeats)]
                    med = {k: statistics.median(r[k] for r in runs) if runs[0][k] is not None else None for k in runs[0]}
                    # duet's buckets end at parameter boundaries: their number is the profile's
                    # all-reduce calls per step; the model takes them as equal.
                    k = round(med["all_reduce_calls_per_step"] or len(cm.bucket_sizes(size, bucket)))
                    sizes = [size / k] * k
                    bw = bandwidth_at(net["allreduce"], max(sizes))
                    T = cm.all_reduce_s(2, size, len(sizes), bw, latency)
                    b = med["backward_ms"] / 1e3
                    rows.append({"rate": rate, "bucket_mb": bucket, "buckets": len(sizes), "gradient_mb": size / 1e6,
                                 "mpi_latency_us": latency * 1e6, "mpi_bus_gbs": bw / 1e9,
                                 "mpi_pingpong": net["pingpong"], "mpi_allreduce": net["allreduce"],
                                 "predicted_all_reduce_ms": T * 1e3,
                                 "predicted_exposed_ms_original": cm.exposed_s_original(T, b, len(sizes)) * 1e3,
                                 **med, "runs": runs})
                    r = predict(rows[-1])
                    print(f"{rate:>7} buckets {bucket:g} MB ({len(sizes)}): MPI bus {bw / 1e9:.2f} GB/s, latency "
                          f"{latency * 1e6:.0f} us | duet step {r['median_step_ms']:.0f} ms, backward {r['backward_ms']:.0f} ms, "
                          f"all-reduce {r['all_reduce_ms']:.0f} ms/step ({r['bus_gbs'] or 0:.2f} GB/s bus), exposed "
                          f"{r['exposed_ms']:.0f} ms | predicted: original {r['predicted_exposed_ms_original']:.0f} ms, "
                          f"corrected {r['predicted_exposed_ms']:.0f} ms", flush=True)
    finally:
        subprocess.run([HOSTS, "down"])
    load_after = loadavg()
    print(f"load average before {load_before}, after {load_after}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "date": datetime.date.today().isoformat(), "model": args.model,
                       "batch_per_rank": args.batch, "steps": args.steps, "repeats": args.repeats, "ranks": 2,
                       "hosts": 2, "cpus_per_host": 1, "load_before": load_before, "load_after": load_after,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
