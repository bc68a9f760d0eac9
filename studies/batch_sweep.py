#!/usr/bin/env python3
"""Study 2: batch-size sweep. A ResNet-18 trained on CIFAR-10 for one epoch at batch 16, 32, 64, 128
and 256 (the question of a fastai study that measured 415 s per epoch on a CPU and 29 s on a GPU, and
42.8, 34.5, 29.0, 24.2, 23.8 s per epoch on the GPU at those batch sizes): time per epoch, images/s,
memory and CPU utilisation per batch size, from `duet train --profile --log` reports, as tables and
a plot.

  .venv-bench/bin/python studies/batch_sweep.py                    # the study (about 8 minutes on 2 cores)
  .venv-bench/bin/python studies/batch_sweep.py --device cpu,cuda  # and on the GPU, where there is one
  .venv-bench/bin/python studies/batch_sweep.py --quick            # seconds: 2 batch sizes, 64 images

Shortened for 2 cores: an epoch here is --train-images images (default 5,120) of data_batch_1.bin
(the first 5,120 of its 10,000), evaluated on the first --test-images (default 1,000) of
test_batch.bin; the tables also give the time a 50,000-image epoch (the fastai study's) would take at
the measured images/s.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import studylib as sl  # noqa: E402

STUDY = "batch_sweep"
SCRIPT = "batch_sweep.py"
RECORD = 1 + 32 * 32 * 3  # CIFAR-10 binary: a label byte and 3072 pixel bytes
FASTAI_GPU = {16: 42.8, 32: 34.5, 64: 29.0, 128: 24.2, 256: 23.8}  # s per 50k-image epoch, their GPU
FASTAI_CPU = 415.0  # s per epoch, their CPU (the GPU's 29 s is its batch 64)


def cifar_subset(src, dst, n_train, n_test):
    """data_batch_1.bin and test_batch.bin cut to their first records (the official format, shorter)."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for name, n in (("data_batch_1.bin", n_train), ("test_batch.bin", n_test)):
        path = os.path.join(src, name)
        size = os.path.getsize(path)
        if size < n * RECORD:
            sl.fail(f"'{path}' holds {size // RECORD} images, fewer than the {n} asked for")
        with open(path, "rb") as fin, open(os.path.join(dst, name), "wb") as fout:
            fout.write(fin.read(n * RECORD))
    meta = os.path.join(src, "batches.meta.txt")
    if os.path.exists(meta):
        shutil.copy(meta, dst)


def main():
    ap = sl.common_args(STUDY, __doc__)
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--batches", default="16,32,64,128,256")
    ap.add_argument("--train-images", type=int, default=5120)
    ap.add_argument("--test-images", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--width-mult", type=float, default=1.0, help="channel multiplier of the model (--quick: 0.25)")
    a = ap.parse_args()
    if a.quick:
        a.batches, a.train_images, a.test_images, a.width_mult = "8,16", 32, 16, 0.25
    argv = sys.argv[1:]
    batches = [int(b) for b in a.batches.split(",")]
    src = os.path.join(a.data, "cifar10")
    if not os.path.exists(os.path.join(src, "data_batch_1.bin")):
        sl.fail(f"no CIFAR-10 at '{src}' (expected data_batch_1.bin and test_batch.bin): pass --data")
    machine, devs, duet = sl.start(a)
    data = os.path.join(duet.work, "cifar10")
    cifar_subset(src, data, a.train_images, a.test_images)
    probes = {d: duet.probe(d) for d in devs}

    runs = {}
    for d in devs:
        # per-op on the CPU (op times, for the per-op table; costs <0.5% there); throughput on a GPU, where per-op
        # timing records CUDA events around every op
        mode = "per-op" if d == "cpu" else "throughput"
        for b in batches:
            name = f"{d.replace(':', '')}_b{b}"
            rep, log = os.path.join(duet.work, name + ".json"), os.path.join(duet.work, name + ".jsonl")
            width = ["--width-mult", f"{a.width_mult:g}"] if a.width_mult != 1.0 else []
            rc, out, secs = duet.run(["train", "--model", a.model] + width + ["--dataset", "cifar10", "--data", data,
                                      "--batch", b, "--epochs", 1, "--lr", f"{a.lr:g}", "--workers", a.workers,
                                      "--profile", rep, "--profile-mode", mode, "--log", log], name, device=d,
                                     check=False, fresh=(rep, log))
            if rc != 0:
                runs[(d, b)] = {"error": (out.strip().splitlines() or ["?"])[-1], "seconds": secs}
                print(f"  batch {b} on {d} failed: {runs[(d, b)]['error']}", file=sys.stderr)
                continue
            runs[(d, b)] = {"report": sl.load_report(rep), "log": sl.read_jsonl(log)[-1], "seconds": secs, "mode": mode}
    machine.finish(duet.work, a.replot)
    ok = {k: v for k, v in runs.items() if "report" in v}
    if not ok:
        raise sl.StudyError("every run failed; see the logs in " + duet.work)
    reports = [v["report"] for v in ok.values()]
    plt = sl.plt()

    # ---- the sweep table ----
    rows, points = [], []
    any_gpu = any(d != "cpu" for d in devs)
    for (d, b), r in runs.items():
        if "error" in r:
            rows.append([d, b] + ["failed: " + r["error"]] + [""] * (13 + any_gpu))
            continue
        rep, log = r["report"], r["log"]
        tm = sl.telemetry_means(rep)
        w = sl.phase_ms(rep, kind="wall")
        med = sl.median([s["dur_ns"] for s in sl.timed_steps(rep)]) / 1e6
        ips = log["images_per_s"]
        p = {"device": d, "batch": b, "steps": len(rep["steps"]), "epoch_s": log["train_seconds"],
             "images_per_s": ips, "epoch_50k_s": 50000 / ips, "eval_s": log["eval_seconds"],
             "median_step_ms": med, "ms_per_image": {k: w[k] / b for k in ("data", "forward", "backward", "optimizer", "other")},
             "peak_tensor_bytes": sl.train_peak(rep),
             "peak_rss_bytes": rep["memory"]["process"]["hwm_bytes"],
             "process_cpu_pct": tm["process_cpu_pct"], "process_cpu_max": ((rep.get("telemetry") or {}).get("summary") or {}).get("process_cpu_pct", {}) or {},
             "other_load_pct": sl.other_load_pct(rep, machine.logical_cpus), "test_acc": log["test_acc"],
             "timing_mode": rep["timing_mode"]}
        p["process_cpu_max"] = p["process_cpu_max"].get("max")
        points.append(p)
        summ = (rep.get("telemetry") or {}).get("summary") or {}
        gpu = next((v for k, v in summ.items() if k.endswith(".util_pct") and v), None)
        p["gpu_util_pct"] = gpu["mean"] if gpu else None
        rows.append([d, b, p["steps"], sl.f(p["epoch_s"]), sl.f(ips, 0), sl.f(p["epoch_50k_s"], 0), sl.f(med, 1),
                     sl.f(p["ms_per_image"]["data"], 2), sl.f(p["ms_per_image"]["forward"], 2),
                     sl.f(p["ms_per_image"]["backward"], 2), sl.f(p["ms_per_image"]["optimizer"], 2),
                     sl.f(p["eval_s"]), sl.f(p["peak_tensor_bytes"] / sl.MIB, 0),
                     sl.f(p["peak_rss_bytes"] / sl.MIB, 0), sl.f(p["process_cpu_pct"], 0, "%"),
                     sl.f(p["other_load_pct"], 0, "%")] + ([sl.f(p["gpu_util_pct"], 0, "%")] if any_gpu else []))
    sweep_md = sl.md_table(
        ["device", "batch", "steps", f"epoch s ({a.train_images:,} images)", "images/s", "50k-image epoch s (projected)",
         "median step ms", "data ms/img", "forward ms/img", "backward ms/img", "optimizer ms/img",
         f"eval s ({a.test_images:,})", "peak tensors MiB", "peak RSS MiB", "duet CPU (100% = 1 CPU)",
         "other processes"] + (["GPU utilisation (NVML)"] if any_gpu else []), rows)

    # ---- per op, per image, per batch (CPU, per-op mode) ----
    ops_md = ""
    cpu_b = [b for b in batches if ("cpu", b) in ok and ok[("cpu", b)]["report"]["op_table"]]
    if cpu_b:
        ref = ok[("cpu", cpu_b[len(cpu_b) // 2])]["report"]
        keys = [(o["key"], o["phase"]) for o in ref["op_table"]][:12]
        orow = []
        for k, ph in keys:
            row = [f"`{k}`", ph]
            for b in cpu_b:
                rep = ok[("cpu", b)]["report"]
                o = next((x for x in rep["op_table"] if x["key"] == k and x["phase"] == ph), None)
                row.append(sl.f(o["self_ns"] / len(rep["steps"]) / b / 1e6, 3) if o else "-")
            o = next(x for x in ref["op_table"] if x["key"] == k and x["phase"] == ph)
            row += [sl.f(o["flop_per_byte"], 1) if o["flop_per_byte"] else "-", o["bound"] or "-"]
            for b in (cpu_b[0], cpu_b[-1]):
                rep = ok[("cpu", b)]["report"]
                ob = next((x for x in rep["op_table"] if x["key"] == k and x["phase"] == ph), None)
                row.append(sl.f(ob["gflops"], 1) if ob and ob["flops"] else "-")
            orow.append(row)
        ops_md = sl.md_table(["op", "phase"] + [f"b{b} ms/img" for b in cpu_b] +
                             [f"FLOP/byte (b{ref['run_config'].get('batch')})", "bound",
                              f"GFLOP/s b{cpu_b[0]}", f"GFLOP/s b{cpu_b[-1]}"], orow)

    # ---- which kernel ran: the forward convolutions by shape, at the middle batch size ----
    kern_md = ""
    if cpu_b:
        ref = ok[("cpu", cpu_b[len(cpu_b) // 2])]["report"]
        gemm = sl.probe_point(probes["cpu"], "cpu", a.threads)["gemm_gflops"]
        agg = {}
        for o in ref["op_records"]:
            if o["name"] == "conv2d" and o["phase"] == "forward":
                g = agg.setdefault((o["shapes"], o["impl"]), {"ns": 0, "flops": 0.0, "bytes": 0.0, "layers": 0})
                g["ns"] += o["self_ns"]
                g["flops"] += o["flops"]
                g["bytes"] += o["bytes"]
                g["layers"] += 1
        krows = []
        for (shapes, impl), g in sorted(agg.items(), key=lambda kv: -kv[1]["ns"]):
            gfs = g["flops"] / g["ns"]
            krows.append([f"`{shapes}`", g["layers"], impl or "-", sl.f(g["flops"] / g["bytes"], 0),
                          sl.f(gfs, 0), f"{100 * gfs / gemm:.0f}%", sl.pct(g["ns"] / ref["totals"]["step_ns"])])
        kern_md = sl.md_table(["input, weight", "layers", "oneDNN implementation", "FLOP/byte", "GFLOP/s",
                               "of the probe's GEMM", "% of step"], krows)

    # ---- figures ----
    fig, axs = plt.subplots(2, 2, figsize=(11, 7.5))
    for d in devs:
        pts = [p for p in points if p["device"] == d]
        if not pts:
            continue
        bs = [p["batch"] for p in pts]
        axs[0][0].plot(bs, [p["epoch_50k_s"] for p in pts], "o-", label=f"duet {d} (projected from {a.train_images:,} images)")
        for p in pts:
            axs[0][0].annotate(f"{p['epoch_50k_s']:.0f}", (p["batch"], p["epoch_50k_s"]), fontsize=7,
                               textcoords="offset points", xytext=(3, 4))
        axs[0][1].plot(bs, [p["images_per_s"] for p in pts], "o-", label=f"duet {d}")
        for p in pts:
            axs[0][1].annotate(f"{p['images_per_s']:.0f}", (p["batch"], p["images_per_s"]), fontsize=7,
                               textcoords="offset points", xytext=(3, 4))
        axs[1][0].plot(bs, [p["peak_tensor_bytes"] / sl.MIB for p in pts], "o-", label=f"tensors (allocator peak), {d}")
        axs[1][0].plot(bs, [p["peak_rss_bytes"] / sl.MIB for p in pts], "s--", label=f"process RSS peak, {d}")
        axs[1][1].plot(bs, [p["process_cpu_pct"] for p in pts], "o-", label=f"duet, mean, {d}")
        axs[1][1].plot(bs, [p["process_cpu_max"] for p in pts], "v:", label=f"duet, max, {d}")
        axs[1][1].plot(bs, [p["other_load_pct"] for p in pts], "x--", color="grey", label="other processes, mean")
    fb = sorted(FASTAI_GPU)
    axs[0][0].plot(fb, [FASTAI_GPU[b] for b in fb], "^:", color="tab:green", label="fastai study, GPU (its numbers)")
    axs[0][0].plot([64], [FASTAI_CPU], "v", color="tab:red", label="fastai study, CPU (its number)")
    axs[0][0].set_ylabel("seconds per 50,000-image epoch")
    axs[0][0].set_yscale("log")
    axs[0][1].set_ylabel("training images/s")
    axs[0][1].set_ylim(bottom=0)
    axs[1][0].set_ylim(bottom=0)
    from matplotlib.ticker import ScalarFormatter
    axs[0][0].yaxis.set_major_formatter(ScalarFormatter())
    axs[0][0].yaxis.set_minor_formatter(ScalarFormatter())
    axs[0][0].tick_params(axis="y", which="minor", labelsize=7)
    axs[1][0].set_ylabel("MiB")
    axs[1][1].set_ylabel("% of one CPU")
    axs[1][1].axhline(100 * a.threads, color="grey", lw=0.8, ls="--")
    for ax in (axs[0][0], axs[0][1], axs[1][0], axs[1][1]):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches)
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{a.model} on CIFAR-10, one epoch per batch size, {machine.cpu}, {a.threads} threads", fontsize=9)
    sl.savefig(fig, os.path.join(a.out, "sweep.png"))

    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = 0
    ticks, labels = [], []
    for p in points:
        bottom = 0
        for ph in ("data", "forward", "backward", "optimizer", "other"):
            v = p["ms_per_image"][ph]
            ax.bar(x, v, bottom=bottom, color=sl.PHASE_COLORS[ph], label=ph if x == 0 else None)
            bottom += v
        ticks.append(x)
        labels.append(f"{p['batch']}\n{p['device']}")
        x += 1
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per image")
    ax.set_title("training time per image by phase (wall time from phase marks, steps after the first)", fontsize=9)
    ax.legend(fontsize=7)
    sl.savefig(fig, os.path.join(a.out, "phases.png"))

    # ---- write ----
    load = sl.load_verdict(reports, machine.logical_cpus)
    pp = sl.probe_point(probes[devs[0]], devs[0], a.threads)
    block = [
        machine.header(sl.command_line(SCRIPT, argv)),
        f"{a.model}{f' at width {a.width_mult:g}' if a.width_mult != 1.0 else ''} (ResNet-18 with the CIFAR stem: "
        f"3x3 stride-1 first convolution, no max-pool), SGD with momentum "
        f"0.9, lr {a.lr:g}, one epoch of {a.train_images:,} CIFAR-10 images (crop + flip, {a.workers} loader "
        f"threads) per batch size, evaluated on {a.test_images:,} test images. Load: {load}.\n",
        "### Time, throughput, memory and utilisation per batch size\n", sweep_md,
        "Epoch and eval seconds, images/s: the trainer's `--log` (training time only; images/s = images / training "
        "seconds); the 50k-image epoch is 50,000 / images/s. Median step leaves out the first step; ms/img per phase "
        "is the mean wall time per step in the phase (phase marks) over the batch. Peak tensors: the allocator's high-water "
        "mark during the training steps; RSS: the process's (VmHWM). CPU: the report's telemetry, sampled every 100 ms. "
        + ("Timing mode: per-op on the CPU (the op table below; it costs under 0.5% of a step there, "
           "docs/profiler.md), throughput on a GPU.\n"),
        "![sweep](IMGDIR/sweep.png)\n",
        "![phases](IMGDIR/phases.png)\n",
    ]
    if ops_md:
        block += ["### Where the time per image goes, per batch size (CPU)\n", ops_md,
                  "Self time per step over the batch, all steps of the epoch; FLOP/byte and bound at the middle batch "
                  f"size against this run's probe (GEMM {pp['gemm_gflops']:.0f} GFLOP/s, copy {pp['copy_gbs']:.1f} GB/s).\n"]
    if kern_md:
        mid = cpu_b[len(cpu_b) // 2]
        block += [f"### Which kernel ran: forward convolutions by shape (CPU, batch {mid})\n", kern_md,
                  "From the report's op records (`duet report FILE --group-by-shape` prints the same): one row per "
                  "input and weight shape and the oneDNN implementation that ran; GFLOP/s counts a convolution's "
                  "direct FLOPs (2 N Cout Ho Wo Cin kh kw), also for Winograd (`jit_wino_4x3`), which does fewer "
                  "multiplications, so it can exceed the probe's GEMM speed.\n"]
    block.append(f"{sl.sensors_note(reports)}.\n")
    text = "\n".join(block)
    summary = {"model": a.model, "train_images": a.train_images, "test_images": a.test_images, "points": points,
               "failed": {f"{d} b{b}": r["error"] for (d, b), r in runs.items() if "error" in r},
               "wall_s": machine.wall_s, "cpu": machine.cpu, "threads": a.threads, "load": load, "probe": pp}
    sl.publish(a, machine, STUDY, SCRIPT, text, summary, duet)


if __name__ == "__main__":
    sl.main_guard(main)
