#!/usr/bin/env python3
"""What data-parallel scaling to expect: a ring all-reduce cost model filled in with each zoo
model's gradient size and a measured step time, giving the predicted efficiency at 2 to 64
processes over Ethernet and NVLink.

Ring all-reduce of S bytes over N ranks in k buckets (each bucket a ring of 2 (N - 1) steps):

    T(N) = 2 (N - 1) k alpha  +  2 (N - 1) / N * S / B

alpha: the latency of one step, B: the bandwidth of one rank's link. A step of t seconds of
compute (backward b of it) then takes
    no overlap:                t + T                       efficiency t / (t + T)
    all-reduce during backward t + max(T - b, T / k)       (the last bucket cannot overlap)
Efficiency is images/s of N ranks over N times one rank's images/s (weak scaling: --batch per rank
fixed). The step times are duet's measured ones (bench/results/train_throughput.json: median step
at the batch given there, on the CPU named there); --step-scale divides them, to ask what a faster
device (a GPU) would see. Link figures are nominal (line rate; TCP reaches less).

  python3 bench/dist_cost_model.py                      # the table of docs/distributed.md
  python3 bench/dist_cost_model.py --step-scale 50      # steps 50 times faster
"""
import argparse
import json
import math
import os

LINKS = {  # name: (bandwidth bytes/s per rank, latency s per ring step)
    "10 GbE": (1.25e9, 30e-6),
    "25 GbE": (3.125e9, 20e-6),
    "100 GbE": (12.5e9, 10e-6),
    "NVLink (H100)": (360e9, 5e-6),  # NVLink 4: 450 GB/s per direction; NCCL's all-reduce bus bandwidth is lower
}


def all_reduce_s(n, size, buckets, bandwidth, latency):
    return 2 * (n - 1) * buckets * latency + 2 * (n - 1) / n * size / bandwidth


def bucket_sizes(size, bucket_mb):
    """Bytes per bucket: full buckets of bucket_mb, the rest in the last (duet fills them in order)."""
    limit = bucket_mb * 1e6
    full = int(size // limit)
    rest = size - full * limit
    return [limit] * full + ([rest] if rest > 0 else [])


def exposed_s_original(T, backward, k):
    """The table's formula: the all-reduce (T) runs during backward, except the last bucket's share."""
    return max(T - backward, T / k)


def exposed_s(n, sizes, backward, bandwidth, latency, ready=None, overlap_speed=1.0):
    """Exposed communication per step with the buckets queued one after another (one communication
    thread, as duet and DDP run them): bucket i becomes ready at ready[i] seconds into backward (by
    default when backward has produced its share of the gradient bytes), starts when it is ready and
    the previous one is done, and needs its own ring time. While backward runs, communication goes
    at `overlap_speed` of its speed alone (1 where a rank has a core to spare for it; less where
    the communication thread shares the rank's cores with backward: TCP's copies and MPI's sums
    are CPU work). `bandwidth` should be what the all-reduce gets while the ranks train, which
    across hosts here was 0.4-0.7 of what MPI's own benchmark gets alone
    (bench/results/dist_hosts.json). What ends after backward is exposed."""
    total = sum(sizes)
    if ready is None:
        ready, acc = [], 0.0
        for s in sizes:
            acc += s
            ready.append(backward * acc / total)
    t = 0.0
    for s, r in zip(sizes, ready):
        t = max(t, r)
        work = all_reduce_s(n, s, 1, bandwidth, latency)  # seconds at full speed
        if t < backward:  # the part that fits before backward ends goes at overlap_speed
            slow = min(work / overlap_speed, backward - t)
            work -= slow * overlap_speed
            t += slow
        t += work
    return max(t - backward, 0.0)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--throughput", default=os.path.join(here, "results", "train_throughput.json"))
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--backward-share", type=float, default=2 / 3, help="part of a step that is backward")
    p.add_argument("--step-scale", type=float, default=1.0, help="divide the measured step times by this")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 64])
    args = p.parse_args()
    rows = json.load(open(args.throughput))["rows"]
    print(f"step times: {os.path.relpath(args.throughput)} / {args.step_scale:g}; buckets of {args.bucket_mb:g} MB; backward "
          f"{args.backward_share:.2f} of a step")
    head = " ".join(f"{f'{n} ranks':>13}" for n in args.ranks)
    print(f"{'model':16} {'grad MB':>7} {'step ms':>8} {'link':14} {head}   (efficiency: no overlap / overlapped)")
    for r in rows:
        size = 4 * r["duet_parameters"]  # f32 gradients
        t = r["duet_step_ms"] / 1e3 / args.step_scale
        k = max(1, math.ceil(size / (args.bucket_mb * 1e6)))
        for name, (bw, lat) in LINKS.items():
            cells = []
            for n in args.ranks:
                T = all_reduce_s(n, size, k, bw, lat)
                plain = t / (t + T)
                overlapped = t / (t + max(T - args.backward_share * t, T / k))
                cells.append(f"{plain:6.0%}/{overlapped:4.0%}")
            print(f"{r['model']:16} {size / 1e6:7.1f} {t * 1e3:8.1f} {name:14} " + " ".join(f"{c:>13}" for c in cells))


if __name__ == "__main__":
    main()
