#!/usr/bin/env python3
"""Study 1: transfer learning with a profile. DenseNet-121 with torchvision's ImageNet weights (or
random weights where they cannot be downloaded: the page says which), a new 2-class head, cat and dog
photos at 224 px, Adam, batch 64 and 128, learning rates 0.003 and 0.03. Every run is a real
`duet train --init-from ... --profile --trace --log`; the tables and figures are read from those
reports: per-op time and memory, the step-time breakdown (data, forward, backward, optimizer),
memory over time, CPU utilisation (and temperature and power where the machine exposes them).

  .venv-bench/bin/python studies/transfer_learning.py                  # the study (about 10 minutes on 2 cores)
  .venv-bench/bin/python studies/transfer_learning.py --device cpu,cuda # CPU against GPU, where there is one
  .venv-bench/bin/python studies/transfer_learning.py --quick           # seconds: 32 px, batches 4 and 8, lr 0.003

Shortened for 2 cores and 23 GiB: each run is one epoch over --train-images photos (default 256 of
the 1,000: 8 steps at batch 32, 4 at batch 64) and is evaluated on --test-images (default 64 of the
300). Batches are 32 and 64, not 64 and 128: at 224 px duet's DenseNet-121 keeps about 7.5 GiB of
activations for backward at batch 64, so batch 128 needs about 20 GiB (`--batches 64,128` on a
machine that has it).
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import studylib as sl  # noqa: E402

STUDY = "transfer_learning"
SCRIPT = "transfer_learning.py"


def subset_folder(src, dst, n_train, n_test):
    """An image folder of the first photos of each class (sorted by name), as symbolic links."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    counts = {}
    for split, n in (("train", n_train), ("test", n_test)):
        classes = sorted(d for d in os.listdir(os.path.join(src, split)) if os.path.isdir(os.path.join(src, split, d)))
        per = max(1, n // len(classes))
        for c in classes:
            files = sorted(os.listdir(os.path.join(src, split, c)),
                           key=lambda s: (len(s), s))[:per]
            os.makedirs(os.path.join(dst, split, c))
            for fn in files:
                os.symlink(os.path.abspath(os.path.join(src, split, c, fn)), os.path.join(dst, split, c, fn))
            counts[(split, c)] = len(files)
    return counts


def export_weights(a, work):
    """torchvision's densenet121 as .safetensors under duet's names; ImageNet weights when torchvision can
    get them, else random ones (returned note says which)."""
    out = os.path.join(work, f"{a.model}.safetensors")
    info_path = out + ".info.json"
    want = a.weights
    if a.replot:
        if not os.path.exists(info_path):
            raise sl.StudyError(f"--replot: no exported weights recorded in {work}")
        with open(info_path) as fh:
            return out, json.load(fh)
    if os.path.exists(out) and os.path.exists(info_path):
        with open(info_path) as fh:
            info = json.load(fh)
        if info.get("requested") == want:
            print(f"weights: reusing {out} ({info['source']})", file=sys.stderr)
            return out, info
    script = os.path.join(sl.ROOT, "scripts", "export_torchvision.py")
    cmd = [sys.executable, script, a.model, out]
    info = {"requested": want}
    if want != "random":
        p = subprocess.run(cmd + ["--weights", want], capture_output=True, text=True)
        if p.returncode == 0:
            info["source"] = f"torchvision weights {want}"
            info["pretrained"] = True
        else:
            last = (p.stderr.strip().splitlines() or ["?"])[-1]
            info["fallback_reason"] = last
            print(f"weights: torchvision could not give {want} ({last}); exporting random weights instead",
                  file=sys.stderr)
    if "source" not in info:
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise sl.StudyError(f"scripts/export_torchvision.py failed:\n{p.stderr[-2000:]}")
        info["source"] = "random weights (torchvision's initialisation, weights=None)"
        info["pretrained"] = False
    sl.write_json(info_path, info)
    return out, info


def run_name(device, batch, lr):
    return f"{device.replace(':', '')}_b{batch}_lr{lr:g}"


def memory_timeline(trace_path):
    """(t seconds, live MiB) after each op, and the phase spans [(name, start s, end s)], from the Chrome trace."""
    with open(trace_path) as fh:
        t = json.load(fh)
    mem, spans = [], []
    for e in t["traceEvents"]:
        if e.get("ph") == "C" and e.get("name", "").startswith("live memory"):
            mem.append((e["ts"] / 1e6, e["args"]["MiB"]))
        elif e.get("ph") == "X" and e.get("cat") == "phase":
            spans.append((e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    mem.sort()
    return mem, spans


def block_of(path):
    """DenseNet module paths by part: the stem, each dense block and transition, the head."""
    if not path or path == "(no module)":
        return "(no module): data, loss, optimizer, gradient sums"
    parts = path.split(".")
    if parts[0] == "features" and len(parts) > 1:
        if parts[1].startswith(("denseblock", "transition")):
            return "features." + parts[1]
        if parts[1] in ("conv0", "norm0", "relu0", "pool0"):
            return "stem (conv0, norm0, relu0, pool0)"
        return "features." + parts[1]
    return parts[0]


def main():
    ap = sl.common_args(STUDY, __doc__)
    ap.add_argument("--model", default="densenet121")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batches", default="32,64",
                    help="the original study used 64,128; 128 needs about 20 GiB of memory at 224 px")
    ap.add_argument("--lrs", default="0.003,0.03")
    ap.add_argument("--train-images", type=int, default=256, help="photos per run's epoch, half of each class")
    ap.add_argument("--test-images", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--weights", default="DEFAULT",
                    help="torchvision weights name (DEFAULT: ImageNet), 'random', or a torch.save file")
    a = ap.parse_args()
    if a.quick:
        a.image_size, a.batches, a.lrs, a.train_images, a.test_images = 32, "4,8", "0.003", 16, 8
        if a.weights == "DEFAULT":
            a.weights = "random"  # no download attempt in a check that must take seconds
    argv = sys.argv[1:]
    batches = [int(b) for b in a.batches.split(",")]
    lrs = [float(x) for x in a.lrs.split(",")]
    src = os.path.join(a.data, "cats_dogs")
    if not os.path.isdir(os.path.join(src, "train")):
        sl.fail(f"no cat/dog photos at '{src}' (expected train/ and test/ inside): pass --data")
    machine, devs, duet = sl.start(a)

    weights, winfo = export_weights(a, duet.work)
    counts = subset_folder(src, os.path.join(duet.work, "photos"), a.train_images, a.test_images)
    n_train = sum(v for (s, _), v in counts.items() if s == "train")
    n_test = sum(v for (s, _), v in counts.items() if s == "test")

    probes = {d: duet.probe(d) for d in devs}
    runs = {}
    for d in devs:
        for b in batches:
            for lr in lrs:
                name = run_name(d, b, lr)
                rep = os.path.join(duet.work, name + ".json")
                log = os.path.join(duet.work, name + ".jsonl")
                trace = os.path.join(duet.work, name + ".trace.json")
                _, _, secs = duet.run(
                    ["train", "--model", a.model, "--dataset", "folder", "--data", os.path.join(duet.work, "photos"),
                     "--image-size", a.image_size, "--init-from", weights, "--optimizer", "adam", "--lr", f"{lr:g}",
                     "--batch", b, "--epochs", a.epochs, "--workers", a.workers,
                     "--profile", rep, "--trace", trace, "--log", log], name, device=d, fresh=(rep, log, trace))
                runs[(d, b, lr)] = {"report": sl.load_report(rep), "log": sl.read_jsonl(log), "trace": trace,
                                    "seconds": secs}
    machine.finish(duet.work, a.replot)
    reports = [r["report"] for r in runs.values()]
    plt = sl.plt()

    # ---- runs ----
    rows = []
    summary = {"runs": []}
    for (d, b, lr), r in runs.items():
        rep, last = r["report"], r["log"][-1]
        tm = sl.telemetry_means(rep)
        dev_mem = rep["memory"]["devices"][0]
        med = sl.median([s["dur_ns"] for s in sl.timed_steps(rep)]) / 1e9
        rows.append([d, b, f"{lr:g}", len(rep["steps"]), f"{last['train_loss']:.3f}", sl.pct(last["train_acc"]),
                     sl.pct(last["test_acc"]), sl.f(last["train_seconds"]), sl.f(last["images_per_s"]),
                     sl.f(med, 2), sl.f(sl.train_peak(rep) / sl.MIB, 0), sl.f(rep["memory"]["process"]["hwm_bytes"] / sl.MIB, 0),
                     sl.f(tm["process_cpu_pct"], 0, "%"), sl.f(sl.other_load_pct(rep, machine.logical_cpus), 0, "%")])
        summary["runs"].append({"device": d, "batch": b, "lr": lr, "steps": len(rep["steps"]),
                                "train_loss": last["train_loss"], "train_acc": last["train_acc"],
                                "test_acc": last["test_acc"], "train_seconds": last["train_seconds"],
                                "images_per_s": last["images_per_s"], "median_step_s": med,
                                "peak_tensor_bytes": sl.train_peak(rep), "peak_rss_bytes": rep["memory"]["process"]["hwm_bytes"],
                                "process_cpu_pct": tm["process_cpu_pct"], "machine_cpu_pct": tm["machine_cpu_pct"]})
    runs_md = sl.md_table(["device", "batch", "lr", "steps", "train loss", "train acc", f"test acc ({n_test})",
                           "train s", "images/s", "median step s", "peak tensors MiB", "peak RSS MiB",
                           "process CPU", "other processes"], rows)

    # ---- step breakdown (first lr) ----
    lr0 = lrs[0]
    rows = []
    for d in devs:
        for b in batches:
            rep = runs[(d, b, lr0)]["report"]
            w = sl.phase_ms(rep, kind="wall")
            o = sl.phase_ms(rep, kind="ops")
            n = len(sl.timed_steps(rep))
            rows.append([d, b, n] + [sl.f(w[p] / 1000, 2) for p in ("data", "forward", "backward", "optimizer", "other")] +
                        [sl.f(o["untracked"] / 1000, 3), sl.f(w["step"] / 1000, 2), sl.f(w["step"] / b, 0),
                         f"{w['backward'] / w['forward']:.2f}"])
    steps_md = sl.md_table(["device", "batch", "steps averaged", "data s", "forward s", "backward s", "optimizer s",
                            "other s", "outside ops s", "step s", "ms per image", "backward / forward"], rows)

    # ---- top ops (first lr), per batch, per image ----
    top_rows, top_data = [], {}
    for d in devs:
        rb = {b: runs[(d, b, lr0)]["report"] for b in batches}
        base = rb[batches[0]]
        keys = [(o["key"], o["phase"]) for o in base["op_table"]][:15]
        for key, phase in keys:
            row = [d, f"`{key}`", phase]
            for b in batches:
                o = next((x for x in rb[b]["op_table"] if x["key"] == key and x["phase"] == phase), None)
                nsteps = len(rb[b]["steps"])
                if o is None:
                    row += ["-", "-"]
                    continue
                row += [sl.f(o["self_ns"] / nsteps / b / 1e6, 2), sl.pct(o["pct"])]
                top_data.setdefault((d, b), []).append((key, phase, o["self_ns"] / nsteps / b / 1e6))
            o = next(x for x in base["op_table"] if x["key"] == key and x["phase"] == phase)
            row += [o["calls"] // max(1, len(base["steps"])), sl.f(o["gflops"], 1) if o["flops"] else "-",
                    sl.f(o["flop_per_byte"], 2) if o["flop_per_byte"] else "-", o["bound"] or "-",
                    sl.pct(o["roof_pct"], 0) if o["roof_pct"] is not None else "-",
                    sl.f(o["bytes_allocated"] / len(base["steps"]) / sl.MIB, 0),
                    (o["impl"] or "-").replace(",", ", ")]
            top_rows.append(row)
    heads = ["device", "op", "phase"]
    for b in batches:
        heads += [f"b{b} ms/image", f"b{b} % step"]
    heads += [f"calls/step", f"GFLOP/s (b{batches[0]})", "FLOP/byte", "bound", "% of roof", "alloc MiB/step",
              "implementation (oneDNN)"]
    top_md = sl.md_table(heads, top_rows)

    # ---- per block (first lr, first batch) ----
    block_rows = []
    for d in devs:
        rep = runs[(d, batches[0], lr0)]["report"]
        nsteps = len(rep["steps"])
        agg = {}
        order = []
        for row in rep["layer_table"]:
            k = block_of(row["key"])
            if k not in agg:
                agg[k] = {"forward": 0, "backward": 0, "optimizer": 0, "data": 0, "flops": 0, "alloc": 0}
                order.append(k)
            agg[k][row["phase"]] = agg[k].get(row["phase"], 0) + row["self_ns"]
            agg[k]["flops"] += row["flops"]
            agg[k]["alloc"] += row["bytes_allocated"]
        total = sum(sum(v[p] for p in ("forward", "backward", "optimizer", "data")) for v in agg.values())
        for k in order:
            v = agg[k]
            t = sum(v[p] for p in ("forward", "backward", "optimizer", "data"))
            block_rows.append([d, k, sl.f(v["forward"] / nsteps / 1e6, 0), sl.f(v["backward"] / nsteps / 1e6, 0),
                               sl.f(v["optimizer"] / nsteps / 1e6, 0), sl.pct(t / total),
                               sl.f(v["flops"] / nsteps / 1e9, 1),
                               sl.f(v["flops"] / t, 1) if t and v["flops"] else "-",
                               sl.f(v["alloc"] / nsteps / sl.MIB, 0)])
    blocks_md = sl.md_table(["device", "part of the network", "forward ms/step", "backward ms/step",
                             "optimizer ms/step", "% of op time", "GFLOP/step", "GFLOP/s", "alloc MiB/step"],
                            block_rows)

    # ---- memory ----
    mem_rows = []
    for d in devs:
        for b in batches:
            rep = runs[(d, b, lr0)]["report"]
            dm = rep["memory"]["devices"][0]
            pk = dm.get("peak_op") or {}
            last = (rep["steps"][-1].get("memory") or [{}])[0] if rep["steps"] else {}
            tags = last.get("peak_by_tag") or dm["peak_by_tag"]  # at the end of the steps, before evaluation
            mem_rows.append([d, b, sl.f(sl.train_peak(rep) / sl.MIB, 0)] +
                            [sl.f(tags.get(t, 0) / sl.MIB, 0) for t in ("activation", "parameter", "gradient",
                                                                       "optimizer_state", "data")] +
                            [f"`{pk.get('name', '?')}` ({pk.get('phase', '?')}, {pk.get('scope') or '-'}, step {pk.get('step', '?')})",
                             sl.f(rep["memory"]["process"]["hwm_bytes"] / sl.MIB, 0)])
    mem_md = sl.md_table(["device", "batch", "peak MiB", "activation", "parameter", "gradient", "optimizer state",
                          "data", "peak reached at", "peak RSS MiB"], mem_rows, right={1, 2, 3, 4, 5, 6, 7, 9})

    # ---- figures ----
    # memory over time
    fig, axes = plt.subplots(len(devs) * len(batches), 1, figsize=(10, 2.6 * len(devs) * len(batches)), squeeze=False)
    for i, (d, b) in enumerate([(d, b) for d in devs for b in batches]):
        ax = axes[i][0]
        mem, spans = memory_timeline(runs[(d, b, lr0)]["trace"])
        for name, s, e in spans:
            if name in sl.PHASE_COLORS and e - s > 0:
                ax.axvspan(s, e, color=sl.PHASE_COLORS[name], alpha=0.15, lw=0)
        if mem:
            ax.plot([m[0] for m in mem], [m[1] for m in mem], color="black", lw=1, label="live tensors (allocator)")
        ts = sl.telemetry_series(runs[(d, b, lr0)]["report"])
        if ts.get("rss_bytes") and ts["rss_bytes"][0]:
            # the telemetry clock starts with the session; the trace's with its first event: close enough to overlay
            ax.plot(ts["rss_bytes"][0], [v / sl.MIB for v in ts["rss_bytes"][1]], color="tab:red", lw=1, ls="--",
                    label="process RSS")
        ax.set_ylabel("MiB")
        ax.set_title(f"{a.model}, batch {b}, {d}: memory over the profiled steps", fontsize=9)
        from matplotlib.patches import Patch
        handles, _ = ax.get_legend_handles_labels()
        handles += [Patch(color=sl.PHASE_COLORS[p], alpha=0.3, label=p) for p in ("data", "forward", "backward", "optimizer")]
        ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=6)
    axes[-1][0].set_xlabel("seconds since the first profiled op")
    sl.savefig(fig, os.path.join(a.out, "memory.png"))

    # step breakdown per step
    fig, ax = plt.subplots(figsize=(10, 3.6))
    x, ticks, tl = 0.0, [], []
    for d in devs:
        for b in batches:
            for s in runs[(d, b, lr0)]["report"]["steps"]:
                bottom = 0
                for p in ("data", "forward", "backward", "optimizer", "other"):
                    v = (s["wall_ns"] or {}).get(p, 0) / 1e9
                    ax.bar(x, v, bottom=bottom, color=sl.PHASE_COLORS[p], label=p if not ticks else None)
                    bottom += v
                ticks.append(x)
                tl.append(f"b{b} {d}\nstep {s['step']}")
                x += 1
            x += 0.5
    ax.set_xticks(ticks)
    ax.set_xticklabels(tl, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{a.model} step time by phase (wall time from phase marks), lr {lr0:g}", fontsize=9)
    ax.legend(fontsize=7)
    sl.savefig(fig, os.path.join(a.out, "steps.png"))

    # top ops per image
    fig, ax = plt.subplots(figsize=(9, 5))
    d0 = devs[0]
    keys = [(k, p) for k, p, _ in top_data.get((d0, batches[0]), [])][:12][::-1]
    hgt = 0.8 / len(batches)
    for j, b in enumerate(batches):
        vals = {(k, p): v for k, p, v in top_data.get((d0, b), [])}
        ax.barh([i + j * hgt for i in range(len(keys))], [vals.get(k, 0) for k in keys], height=hgt, label=f"batch {b}")
    ax.set_yticks([i + hgt * (len(batches) - 1) / 2 for i in range(len(keys))])
    short = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
    ax.set_yticklabels([f"{k} ({short.get(p, p)})" for k, p in keys], fontsize=8)
    ax.set_xlabel("ms per image (self time per step / batch)")
    ax.set_title(f"{a.model} top ops by self time, {d0}, lr {lr0:g}", fontsize=9)
    ax.legend(fontsize=8)
    sl.savefig(fig, os.path.join(a.out, "top_ops.png"))

    # utilisation
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for (d, b, lr), r in runs.items():
        ts = sl.telemetry_series(r["report"])
        if ts.get("process_cpu_pct"):
            ax.plot(*sl.smooth(*ts["process_cpu_pct"]), lw=1, label=f"duet, b{b} lr {lr:g} {d}")
    for (d, b, lr), r in list(runs.items())[:1]:
        ts = sl.telemetry_series(r["report"])
        if ts.get("machine_cpu_pct"):
            ax.plot(*sl.smooth(ts["machine_cpu_pct"][0], [v * machine.logical_cpus for v in ts["machine_cpu_pct"][1]]),
                    lw=1, color="black", ls=":", label=f"whole machine (b{b} lr {lr:g} run)")
    ax.axhline(100 * a.threads, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("% of one CPU")
    ax.set_xlabel("seconds since profiling started")
    ax.set_title(f"CPU use, sampled every 100 ms, 1 s moving mean ({a.threads} threads = {100 * a.threads}%; "
                 f"the whole machine = {100 * machine.logical_cpus}%)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    sl.savefig(fig, os.path.join(a.out, "utilisation.png"))

    # ---- CPU against GPU ----
    gpu_md = ""
    if len(devs) > 1:
        for b in batches:
            cmp_json = os.path.join(duet.work, f"compare_b{b}.json")
            duet.run(["compare", os.path.join(duet.work, run_name(devs[0], b, lr0) + ".json"),
                      os.path.join(duet.work, run_name(devs[1], b, lr0) + ".json"), "--json", cmp_json],
                     f"compare_b{b}")
            with open(cmp_json) as fh:
                cmp = json.load(fh)
            rows = [[r["name"] if "name" in r else r.get("phase", "?")] + [sl.f(v, 2) for v in r["value"]] +
                    [sl.f(r["ratio"][-1], 2, "x") if r.get("ratio") else "-"] for r in (cmp.get("phases") or [])]
            gpu_md += f"\nBatch {b}, `duet compare` of the two reports (per step):\n\n" + sl.md_table(
                ["phase"] + devs + [f"{devs[1]}/{devs[0]}"], rows)

    # ---- write ----
    sensors = sl.sensors_note(reports)
    load = sl.load_verdict(reports, machine.logical_cpus)
    tm_rows = []
    for (d, b, lr), r in runs.items():
        s = (r["report"].get("telemetry") or {}).get("summary") or {}
        cells = []
        for ch in ("process_cpu_pct", "machine_cpu_pct"):
            v = s.get(ch)
            cells.append(f"{v['mean']:.0f}% / {v['max']:.0f}%" if v else "n/a")
        rss = s.get("rss_bytes")
        cells.append(sl.f(rss["max"] / sl.MIB, 0) if rss else "n/a")
        gpu = [k for k in s if k.startswith("gpu")]
        cells.append(", ".join(f"{k} {s[k]['mean']:.0f}" for k in gpu if s[k]) or "-")
        tm_rows.append([d, b, f"{lr:g}"] + cells)
    tm_md = sl.md_table(["device", "batch", "lr", "duet CPU mean / max (100% = 1 CPU)", "machine CPU mean / max (100% = all)",
                         "RSS max MiB", "GPU channels (mean)"], tm_rows)

    pre = "" if winfo.get("pretrained") else (
        f"**Weights: {winfo['source']}.** torchvision's ImageNet weights could not be downloaded here"
        + (f" (`{winfo['fallback_reason']}`)" if winfo.get("fallback_reason") else "")
        + ": the profile (time, memory, utilisation) is the same with any weights; the losses and accuracies are "
          "those of a network trained from scratch for a few steps, not of transfer learning.\n\n")
    block = [
        machine.header(sl.command_line(SCRIPT, argv)),
        f"{a.model} at {a.image_size} px, {n_train} training photos ({n_train // 2} cats, {n_train // 2} dogs) and "
        f"{n_test} test photos, {a.epochs} epoch per run, Adam; weights from `scripts/export_torchvision.py` "
        f"({winfo['source']}), loaded with `--init-from` (the 1000-class head left out, a new 2-class one trained). "
        f"Load: {load}.\n",
        pre,
        "### Runs\n", runs_md,
        "`train s` and `images/s` are the trainer's (`--log`); the median step leaves out the first step (oneDNN "
        "creates its primitives there); peak tensors is the allocator's high-water mark, peak RSS the process's.\n",
        f"### Step-time breakdown (lr {lr0:g})\n", steps_md,
        "Wall time per phase from the phase marks, mean over the steps after the first; `outside ops` is step time "
        "not inside any op (autograd's walk, module calls).\n",
        "![step breakdown](IMGDIR/steps.png)\n",
        f"### Operators by self time (lr {lr0:g})\n", top_md,
        "Over all profiled steps (the first included); ms per image is self time per step divided by the batch; "
        "`bound` and `% of roof` against the probe below.\n",
        "![top ops](IMGDIR/top_ops.png)\n",
        f"### Where in the network (batch {batches[0]}, lr {lr0:g})\n", blocks_md,
        "From the report's layer table (module path per op, backward ops carrying their forward's module).\n",
        f"### Memory (lr {lr0:g})\n", mem_md,
        "![memory over time](IMGDIR/memory.png)\n",
        "### Utilisation, temperature, power\n", tm_md,
        f"{sensors}.\n",
        "![utilisation](IMGDIR/utilisation.png)\n",
    ]
    pp = sl.probe_point(probes[devs[0]], devs[0], a.threads)
    block.append(f"Roofline ceilings (`duet probe`, this run, {devs[0]}): GEMM {pp['gemm_gflops']:.0f} GFLOP/s, copy "
                 f"{pp['copy_gbs']:.1f} GB/s, ridge {pp['gemm_gflops'] / pp['copy_gbs']:.1f} FLOP/byte.\n")
    if gpu_md:
        block += ["### CPU against GPU\n", gpu_md]
    text = "\n".join(block)
    summary.update({"model": a.model, "image_size": a.image_size, "train_images": n_train, "test_images": n_test,
                    "weights": winfo, "wall_s": machine.wall_s, "cpu": machine.cpu, "threads": a.threads,
                    "load": load, "probe": pp})
    sl.publish(a, machine, STUDY, SCRIPT, text, summary, duet)


if __name__ == "__main__":
    sl.main_guard(main)
