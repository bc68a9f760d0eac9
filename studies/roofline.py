#!/usr/bin/env python3
"""Study 4, part 2: the roofline of a training step. This machine's ceilings measured by `duet probe`
(fp32 GEMM GFLOP/s, copy GB/s), then one training step of resnet50, vit_b_16 and mobilenet_v2 at
224 px profiled op by op (`duet profile --mode per-op`), its ops gathered into groups by the kernel
family that does their work (dense, 1x1 and depthwise convolutions, linear layers, attention
products, normalisation, activations, ...), each forward and backward, and every group placed by its
arithmetic intensity (FLOP per minimum byte, from engine/op_cost.cpp) and achieved GFLOP/s under the
two roofs.

  .venv-bench/bin/python studies/roofline.py                    # about 4 minutes on 2 cores
  .venv-bench/bin/python studies/roofline.py --device cuda      # the same on the GPU, where there is one
  .venv-bench/bin/python studies/roofline.py --quick            # seconds: 32 px, batch 2

Shortened for 2 cores: batch --batch (32) instead of part 1's 64, --steps (3) timed steps after one
warm-up; the groups' FLOP/byte does not depend on the batch much, their speed a little.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import studylib as sl  # noqa: E402

STUDY = "roofline"
SCRIPT = "roofline.py"
MARKERS = {"resnet50": "o", "vit_b_16": "s", "mobilenet_v2": "^"}


def groups(report):
    """{(kind, fwd|bwd|opt): {flops, bytes, ns, calls, ops}} over the report's op records."""
    convs = sl.conv_weights_by_scope(report)
    out = {}
    for o in report["op_records"]:
        kind = sl.op_kind(o["name"], o["phase"], o["scope"], convs)
        ph = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}.get(o["phase"], o["phase"])
        g = out.setdefault((kind, ph), {"flops": 0.0, "bytes": 0.0, "ns": 0, "calls": 0, "ops": set()})
        g["flops"] += o["flops"] or 0
        g["bytes"] += o["bytes"] or 0
        g["ns"] += o["self_ns"]
        g["calls"] += o["calls"]
        g["ops"].add(o["name"])
    return out


def roof(intensity, gemm, copy):
    return min(gemm, intensity * copy)


def main():
    ap = sl.common_args(STUDY, __doc__)
    ap.add_argument("--models", default="resnet50,vit_b_16,mobilenet_v2")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    width = []
    if a.quick:
        a.image_size, a.batch, a.steps = 32, 2, 1
        width = ["--width-mult", "0.25"]
    argv = sys.argv[1:]
    models = [m for m in a.models.split(",") if m]
    machine, devs, duet = sl.start(a)
    probes = {d: duet.probe(d) for d in devs}
    reps = {}
    for d in devs:
        for m in models:
            out = os.path.join(duet.work, f"{d.replace(':', '')}_{m}.json")
            duet.run(["profile", "--model", m, "--image-size", a.image_size] + width +
                     ["--batch", a.batch, "--steps", a.steps, "--warmup", 1, "--mode", "per-op", "--out", out],
                     f"{d.replace(':', '')}_{m}", device=d, fresh=(out,))
            reps[(d, m)] = sl.load_report(out)
    machine.finish(duet.work, a.replot)
    plt = sl.plt()

    tables, summary = "", {"models": {}}
    fig, axs = plt.subplots(len(devs), len(models), figsize=(5.2 * len(models), 4.6 * len(devs)), squeeze=False)
    for di, d in enumerate(devs):
        pp = sl.probe_point(probes[d], d, a.threads if d == "cpu" else None)
        gemm, copy = pp["gemm_gflops"], pp["copy_gbs"]
        ridge = gemm / copy
        for mi, m in enumerate(models):
            rep = reps[(d, m)]
            nsteps = len(rep["steps"])
            step_ns = rep["totals"]["step_ns"]
            gs = groups(rep)
            rows, pts = [], []
            tf = sum(g["flops"] for g in gs.values())
            tb = sum(g["bytes"] for g in gs.values())
            tns = sum(g["ns"] for g in gs.values())
            for (kind, ph), g in sorted(gs.items(), key=lambda kv: -kv[1]["ns"]):
                share = g["ns"] / step_ns
                if share < 0.001:
                    continue
                secs = g["ns"] / 1e9
                gfs = g["flops"] / secs / 1e9 if secs else 0
                gbs = g["bytes"] / secs / 1e9 if secs else 0
                inten = g["flops"] / g["bytes"] if g["bytes"] else None
                if inten:
                    bound = "compute" if inten >= ridge else "memory"
                    rp = gfs / roof(inten, gemm, copy)
                else:
                    bound = "memory (no FLOPs)" if g["bytes"] else "-"
                    rp = gbs / copy if g["bytes"] else None
                rows.append([f"{kind} ({ph})", sl.pct(share), sl.f(g["flops"] / nsteps / 1e9, 1),
                             sl.f(g["bytes"] / nsteps / 1e6, 0), sl.f(inten, 2) if inten else "-",
                             sl.f(gfs, 1) if g["flops"] else "-", sl.f(gbs, 1), bound,
                             sl.pct(rp, 0) if rp is not None else "-", ", ".join(sorted(g["ops"]))])
                if inten and g["flops"]:
                    pts.append((kind, ph, inten, gfs, share))
            step_gfs = tf / (step_ns / 1e9) / 1e9
            step_int = tf / tb
            summary["models"][f"{m} ({d})"] = {
                "step_ms": step_ns / nsteps / 1e6, "gflop_per_step": tf / nsteps / 1e9, "gb_per_step": tb / nsteps / 1e9,
                "flop_per_byte": step_int, "gflops_over_step": step_gfs, "ops_share_of_step": tns / step_ns,
                "groups": [{"group": r[0], "share": r[1], "flop_per_byte": r[4], "gflops": r[5], "bound": r[7],
                            "roof": r[8]} for r in rows]}
            tables += (f"\n**{m}** on {d}, batch {a.batch}: {tf / nsteps / 1e9:,.0f} GFLOP and {tb / nsteps / 1e9:,.1f} GB "
                       f"(minimum) per step, {step_int:.1f} FLOP/byte over the whole step; step "
                       f"{step_ns / nsteps / 1e6:,.0f} ms, {step_gfs:.1f} GFLOP/s over the step "
                       f"({100 * step_gfs / gemm:.0f}% of the GEMM roof)\n\n")
            tables += sl.md_table(["group (phase)", "% of step", "GFLOP/step", "MB/step", "FLOP/byte", "GFLOP/s",
                                   "GB/s", "bound", "% of roof", "ops"], rows, right={1, 2, 3, 4, 5, 6, 8})

            ax = axs[di][mi]
            lo, hi = 0.01, max(1000.0, max((p[2] for p in pts), default=1) * 3)
            xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            ax.plot(xs, [roof(x, gemm, copy) for x in xs], color="black", lw=1.5)
            ax.axvline(ridge, color="black", ls=":", lw=0.8)
            ax.text(hi / 1.3, gemm * 1.25, f"GEMM {gemm:.0f} GFLOP/s", fontsize=7, ha="right")
            ax.text(ridge * 1.08, 0.6 * min(1.0, min((p[3] for p in pts), default=1.0)), f"ridge {ridge:.1f}",
                    fontsize=6, rotation=90, va="bottom")
            ax.text(lo * 1.5, roof(lo * 1.5, gemm, copy) * 1.6, f"copy {copy:.1f} GB/s", fontsize=7, rotation=30)
            for kind, ph, inten, gfs, share in pts:
                ax.scatter(inten, max(gfs, 1e-3), s=20 + 1500 * share, color=sl.KIND_COLORS.get(kind, "grey"),
                           alpha=0.75, edgecolors="black" if ph == "bwd" else "none")
            ax.scatter(step_int, step_gfs, marker="*", s=160, color="gold", edgecolors="black", zorder=5)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(0.3 * min(1.0, min((p[3] for p in pts), default=1.0)), gemm * 3)
            labels = [(step_int, step_gfs, "whole step")]
            labels += [(inten, max(gfs, 1e-3), f"{kind.split(' (')[0]} {ph} {100 * share:.0f}%")
                       for kind, ph, inten, gfs, share in sorted(pts, key=lambda p: -p[4]) if share >= 0.02]
            sl.place_labels(ax, labels)
            ax.set_xlabel("FLOP per byte (minimum bytes)")
            ax.set_ylabel("achieved GFLOP/s")
            ax.set_title(f"{m}, batch {a.batch}, {a.image_size} px, {d}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
    # one legend of kinds for the whole figure
    from matplotlib.lines import Line2D
    present = sorted({k for (_, _), r in reps.items() for (k, _) in groups(r)}, key=list(sl.KIND_COLORS).index)
    handles = [Line2D([], [], marker="o", ls="", color=sl.KIND_COLORS[k], label=k) for k in present
               if k in sl.KIND_COLORS]
    handles.append(Line2D([], [], marker="o", ls="", color="white", markeredgecolor="black", label="backward (black edge)"))
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=7, bbox_to_anchor=(0.5, -0.1))
    fig.suptitle(f"roofline of a training step on {machine.cpu}, {a.threads} threads (ceilings: duet probe, this run); "
                 f"point area = share of the step", fontsize=9)
    fig.tight_layout()
    sl.savefig(fig, os.path.join(a.out, "roofline.png"))

    reports = list(reps.values())
    load = sl.load_verdict(reports, machine.logical_cpus)
    probe_rows = []
    for d in devs:
        key = d if d in probes[d]["devices"] else next(k for k in probes[d]["devices"] if k.startswith(d))
        for p in probes[d]["devices"][key]["points"]:
            probe_rows.append([d, p["threads"] or "-", sl.f(p["gemm_gflops"], 1), sl.f(p["copy_gbs"], 1),
                               sl.f(p["gemm_gflops"] / p["copy_gbs"], 2)])
    block = [
        machine.header(sl.command_line(SCRIPT, argv)),
        f"Load: {load}.\n",
        "### The ceilings (`duet probe`)\n",
        sl.md_table(["device", "threads", "GEMM GFLOP/s (2048^3 fp32)", "copy GB/s (256 MiB, read + write)",
                     "ridge FLOP/byte"], probe_rows),
        "![roofline](IMGDIR/roofline.png)\n",
        f"### Op groups per model (batch {a.batch}, {a.image_size} px, SGD, per-op timing)\n",
        "Groups below 0.1% of the step are left out. FLOP/byte is FLOPs over minimum bytes (each input read once, "
        "each output written once: engine/op_cost.cpp); `bound` compares it with the ridge; `% of roof` is achieved "
        "GFLOP/s over the roof at that intensity (for groups without FLOPs: GB/s over the copy roof).\n",
        tables,
    ]
    text = "\n".join(block)
    summary.update({"batch": a.batch, "image_size": a.image_size, "wall_s": machine.wall_s, "cpu": machine.cpu,
                    "threads": a.threads, "load": load,
                    "probe": {d: sl.probe_point(probes[d], d, a.threads if d == "cpu" else None) for d in devs}})
    sl.publish(a, machine, f"{STUDY} (part 2)", SCRIPT, text, summary, duet)


if __name__ == "__main__":
    sl.main_guard(main)
