#!/usr/bin/python3
"""Plots of duet profile reports (schema duet.profile/1) and batch sweeps (duet.sweep/1).

  scripts/plot_profile.py run.json [--out DIR] [--top 15]
      -> DIR/<name>.roofline.png   ops by FLOP/byte and achieved GFLOP/s under the probed ceilings
         DIR/<name>.top_ops.png    the ops with the most self time per step
         DIR/<name>.steps.png      each step's time split by phase (op time; untracked overhead)
  scripts/plot_profile.py --sweep sweep.json [--out DIR]
      -> DIR/<name>.throughput.png images/s against batch size

Needs Debian's matplotlib (apt-get install python3-matplotlib); run it with /usr/bin/python3.
Only the report's documented fields are read (docs/profiler.md), so it works on any saved report.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLORS = {
    "data": "#8c564b", "copy": "#e377c2", "forward": "#1f77b4", "backward": "#ff7f0e",
    "optimizer": "#2ca02c", "comm": "#9467bd", "other": "#7f7f7f", "untracked": "#d3d3d3",
}
PHASES = ["data", "copy", "forward", "backward", "optimizer", "comm", "other"]
DPI = 110


def load(path, schema):
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        sys.exit(f"plot_profile: '{path}' does not exist")
    except json.JSONDecodeError as e:
        sys.exit(f"plot_profile: '{path}' is not valid JSON: {e}")
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        sys.exit(f"plot_profile: '{path}' has schema {found!r}, expected {schema!r}")
    return doc


def subtitle(report):
    rc = report.get("run_config", {})
    m = report.get("machine", {})
    parts = [f"{k}={rc[k]}" for k in ("model", "batch", "backend", "device", "threads") if k in rc]
    cpu = m.get('cpu_model', '?')
    if m.get('cpu_family'):  # a VM's model name may be the vendor only; the numbers tell the generation
        cpu += f" (family {m['cpu_family']} model {m.get('cpu_model_number', '?')})"
    return f"{' '.join(parts)}\n{cpu}, timing: {report.get('timing_mode', '?')}"


PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "data": "data", "copy": "copy",
               "comm": "comm", "other": "other"}


def place_labels(ax, points, taken=None):
    """Labels next to points without overlapping each other: for each (x, y, text), the first
    of a few offsets whose box (estimated from the text length) is free and inside the axes.
    `taken`: display-space boxes (x0, y0, x1, y1) already used."""
    fig = ax.figure
    fig.canvas.draw()  # fixes the transforms after the limits are set
    frame = ax.get_window_extent()
    taken = list(taken or [])
    offsets = [(5, 4), (5, -11), (-5, 4), (-5, -11), (5, 14), (5, -21), (-5, 14), (-5, -21), (5, 24), (5, -31)]
    char_w, line_h = 5.4, 10.0  # fontsize 7 at DPI, in pixels
    for x, y, text in points:
        px, py = ax.transData.transform((x, y))
        w = char_w * len(text)
        choice = offsets[0]
        for dx, dy in offsets:
            x0 = px + dx if dx > 0 else px + dx - w
            box = (x0, py + dy, x0 + w, py + dy + line_h)
            inside = box[0] >= frame.x0 and box[2] <= frame.x1 and box[1] >= frame.y0 and box[3] <= frame.y1
            if inside and all(box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3] for b in taken):
                choice = (dx, dy)
                break
        dx, dy = choice
        x0 = px + dx if dx > 0 else px + dx - w
        taken.append((x0, py + dy, x0 + w, py + dy + line_h))
        far = abs(dy) > 10  # a leader line when the label had to move away from its point
        ax.annotate(text, (x, y), fontsize=7, xytext=(dx, dy), textcoords="offset pixels",
                    ha="left" if dx > 0 else "right", va="bottom",
                    arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5, shrinkA=0, shrinkB=4) if far else None)


def roofline(report, out, top):
    rows = [r for r in report["op_table"] if r["flops"] > 0 and r["bytes"] > 0 and r["self_ns"] > 0]
    roof = report.get("roofline", {})
    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=DPI)
    if rows:
        step_ns = max(1, sum(r["self_ns"] for r in rows))
        for r in rows:
            size = 30 + 900 * r["self_ns"] / step_ns
            ax.scatter(r["flop_per_byte"], r["gflops"], s=size, alpha=0.7,
                       color=PHASE_COLORS.get(r["phase"], "k"), edgecolors="k", linewidths=0.5)
        xs = [r["flop_per_byte"] for r in rows]
        ys = [r["gflops"] for r in rows]
        lo, hi = min(xs) / 3, max(xs) * 3
    else:
        lo, hi, ys = 0.01, 100, [1]
    if roof.get("probe"):
        gemm, copy = roof["gemm_gflops"], roof["copy_gbs"]
        ridge = gemm / copy
        lo, hi = min(lo, ridge / 10), max(hi, ridge * 10)
        ax.plot([lo, ridge, hi], [lo * copy, gemm, gemm], color="k", linewidth=2)
        ax.axvline(ridge, color="k", linestyle=":", linewidth=1)
        ax.text(ridge, gemm * 1.08, f"ridge {ridge:.1f} FLOP/B", fontsize=8, ha="center")
        ax.text(hi / 1.2, gemm * 1.08, f"GEMM {gemm:.0f} GFLOP/s (compute roof)", fontsize=8, ha="right")
        title_roof = f"ceilings from probe ({roof.get('device')}, {roof.get('threads')} threads)"
        ax.set_ylim(min(ys + [lo * copy]) / 3, gemm * 2)
    else:
        title_roof = "no probe: run `duet probe` for the ceilings"
        ax.set_ylim(min(ys) / 3, max(ys) * 3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte, minimum bytes moved)")
    ax.set_ylabel("achieved GFLOP/s (self time)")
    ax.set_title(f"roofline: {title_roof}\n{subtitle(report)}", fontsize=10)
    fig.tight_layout()  # before the labels: they are placed in the final display coordinates
    taken = []
    if roof.get("probe"):
        # The memory roof's label along its slope, halfway between the left edge and the ridge.
        fig.canvas.draw()
        x_mid = (lo * ridge) ** 0.5
        (x0, y0), (x1, y1) = ax.transData.transform([(lo, lo * copy), (ridge, gemm)])
        angle = math.degrees(math.atan2(y1 - y0, x1 - x0))
        label = ax.text(x_mid, x_mid * copy * 1.15, f"copy {copy:.1f} GB/s (memory roof)", fontsize=8,
                        rotation=angle, rotation_mode="anchor", ha="center", va="bottom")
        box = label.get_window_extent(renderer=fig.canvas.get_renderer())
        taken.append((box.x0, box.y0, box.x1, box.y1))
    if rows:
        # An op name that occurs in several phases (add forward and backward) gets its phase.
        phases_of = {}
        for r in rows:
            phases_of.setdefault(r["key"], set()).add(r["phase"])
        labelled = sorted(rows, key=lambda r: -r["self_ns"])[:top]
        place_labels(ax, [(r["flop_per_byte"], r["gflops"],
                           r["key"] + (f" ({PHASE_SHORT.get(r['phase'], r['phase'])})"
                                       if len(phases_of[r["key"]]) > 1 else ""))
                          for r in labelled], taken)
    ax.grid(True, which="both", alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=PHASE_COLORS[p], label=p)
               for p in PHASES if any(r["phase"] == p for r in rows)]
    if handles:
        ax.legend(handles=handles, loc="lower right", fontsize=8, title="phase (size: time)")
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def top_ops(report, out, top):
    rows = sorted(report["op_table"], key=lambda r: -r["self_ns"])[:top]
    steps = max(1, report["totals"].get("steps", 0))
    unit = "ms per step" if report["totals"].get("steps", 0) else "ms total"
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 1.8), dpi=DPI)
    names = [f"{r['key']} [{r['phase']}]" for r in rows][::-1]
    vals = [r["self_ns"] * 1e-6 / steps for r in rows][::-1]
    colors = [PHASE_COLORS.get(r["phase"], "k") for r in rows][::-1]
    bars = ax.barh(names, vals, color=colors)
    basis = "step" if report["totals"].get("pct_basis") == "step" else "op time"
    for b, r in zip(bars, rows[::-1]):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2,
                f" {b.get_width():.3g} ms, {100 * r['pct']:.1f}% of {basis}", va="center", fontsize=8)
    ax.set_xlabel(f"self time ({unit})")
    ax.set_xlim(0, max(vals + [1e-9]) * 1.35)
    ax.set_title(f"top {len(rows)} ops by self time\n{subtitle(report)}", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def steps_plot(report, out):
    steps = report["steps"]
    if not steps:
        return False
    per_op = report.get("timing_mode") == "per-op"
    labels = [str(s["step"]) for s in steps] + ["mean"]
    positions = list(range(len(steps))) + [len(steps) + 0.8]  # the mean bar set apart
    fig, ax = plt.subplots(figsize=(min(12.0, max(8.5, 0.3 * len(labels) + 3)), 5.0), dpi=DPI)
    bottom = [0.0] * len(labels)
    mean_key = "mean_ops_ns" if per_op else "mean_wall_ns"
    for p in PHASES + (["untracked"] if per_op else []):
        if p == "untracked":
            vals = [s["untracked_ns"] * 1e-6 for s in steps] + [report["phases"]["mean_untracked_ns"] * 1e-6]
        else:
            src = [(s["ops_ns"] if per_op else (s["wall_ns"] or {})) for s in steps]
            mean = report["phases"].get(mean_key) or {}
            vals = [d.get(p, 0) * 1e-6 for d in src] + [mean.get(p, 0) * 1e-6]
        if not any(v > 0 for v in vals):
            continue
        ax.bar(positions, vals, bottom=bottom, color=PHASE_COLORS[p], label=p, width=0.8)
        bottom = [b + v for b, v in zip(bottom, vals)]
    every = max(1, math.ceil(len(steps) / 40))  # at most ~40 step numbers on the axis
    ticks = [i for i in range(len(steps)) if i % every == 0] + [len(labels) - 1]
    ax.set_xticks([positions[i] for i in ticks])
    ax.set_xticklabels([labels[i] for i in ticks], fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    what = "op time per phase + untracked" if per_op else "wall time per phase"
    ips = report["phases"].get("images_per_s")
    ips_text = f", {ips:.1f} images/s" if ips else ""
    ax.set_title(f"step breakdown ({what}{ips_text})\n{subtitle(report)}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return True


def sweep_plot(sweep, out):
    pts = sweep["points"]
    ok = [p for p in pts if p.get("images_per_s")]
    bad = [p for p in pts if not p.get("images_per_s")]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=DPI)
    ax.plot([p["batch"] for p in ok], [p["images_per_s"] for p in ok], marker="o", color="#1f77b4",
            label="images/s")
    for p in ok:
        ax.annotate(f"{p['images_per_s']:.0f}", (p["batch"], p["images_per_s"]), fontsize=8,
                    xytext=(0, 6), textcoords="offset points", ha="center")
    ax.set_ylim(0, max([p["images_per_s"] for p in ok] + [1]) * 1.2)
    for p in bad:
        ax.axvline(p["batch"], color="r", linestyle=":")
        ax.text(p["batch"], ax.get_ylim()[1] * 0.5, f"failed: {p.get('error') or '?'}",
                rotation=90, color="r", fontsize=8, va="center")
    mem = [p for p in pts if p.get("peak_bytes")]
    if mem:  # what the batch costs in memory, on its own axis
        ax2 = ax.twinx()
        ax2.plot([p["batch"] for p in mem], [p["peak_bytes"] / 2**20 for p in mem], marker="s", linestyle="--",
                 color="0.45", label="peak MiB")
        ax2.set_ylabel("peak memory (MiB, allocator)", color="0.35")
        ax2.set_ylim(0, max(p["peak_bytes"] for p in mem) / 2**20 * 1.2)
        lines = ax.get_lines()[:1] + ax2.get_lines()
        ax.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks([p["batch"] for p in pts])
    ax.set_xticklabels([str(p["batch"]) for p in pts])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("images/s (throughput mode)")
    rc = sweep.get("run_config", {})
    ax.set_title("throughput vs batch size\n" + " ".join(f"{k}={v}" for k, v in rc.items()), fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", nargs="?", help="a duet.profile/1 report")
    ap.add_argument("--sweep", help="a duet.sweep/1 document")
    ap.add_argument("--out", default=".", help="folder for the PNG files (default: .)")
    ap.add_argument("--top", type=int, default=15, help="ops in the bar chart and labelled on the roofline")
    a = ap.parse_args()
    if not a.report and not a.sweep:
        ap.error("give a report, --sweep, or both")
    os.makedirs(a.out, exist_ok=True)
    written = []
    try:
        plot_all(a, written)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        sys.exit(f"plot_profile: a field is missing or of the wrong type ({type(e).__name__}: {e}): the input does "
                 f"not follow its schema (docs/profiler.md); `duet report FILE` says which section")
    for w in written:
        print(w)


def plot_all(a, written):
    if a.report:
        r = load(a.report, "duet.profile/1")
        base = os.path.join(a.out, os.path.splitext(os.path.basename(a.report))[0])
        if r.get("timing_mode") == "per-op" and r["op_table"]:
            roofline(r, base + ".roofline.png", a.top)
            top_ops(r, base + ".top_ops.png", a.top)
            written += [base + ".roofline.png", base + ".top_ops.png"]
        else:
            print(f"plot_profile: '{a.report}' has no op table (throughput mode): no roofline or top-ops plot")
        if steps_plot(r, base + ".steps.png"):
            written.append(base + ".steps.png")
    if a.sweep:
        s = load(a.sweep, "duet.sweep/1")
        base = os.path.join(a.out, os.path.splitext(os.path.basename(a.sweep))[0])
        sweep_plot(s, base + ".throughput.png")
        written.append(base + ".throughput.png")


if __name__ == "__main__":
    main()
