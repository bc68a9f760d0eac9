#!/usr/bin/env python3
"""Result tables of README.md and docs/*.md, generated from bench/results/*.json.

A page marks each generated table with two comments; everything between them is this script's:

    <!-- BEGIN TABLE throughput_zen5 (scripts/doc_tables.py) -->
    ... table and a line naming its data file and the machine it ran on ...
    <!-- END TABLE -->

The name picks a recipe in TABLES below (which JSON file, which columns). The text around the
markers is the page's reading of the numbers; the numbers themselves come only from the data.

    python3 scripts/doc_tables.py              # rewrite every marked table from the data
    python3 scripts/doc_tables.py --check      # exit 1 naming the table and first differing line
    python3 scripts/doc_tables.py --list       # every table name, its data and the pages using it
    python3 scripts/doc_tables.py --self-test  # plants a drifted number in a copy: --check must fail

Python 3 standard library only (CI runs it as the ctests docs.tables and docs.tables_drift).
"""
import argparse
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "bench/results"
BEGIN = re.compile(r"^<!-- BEGIN TABLE (\S+) \(scripts/doc_tables\.py\) -->$")
END = "<!-- END TABLE -->"


def load(rel):
    with open(os.path.join(REPO, RESULTS, rel)) as f:
        return json.load(f)


def source(*rels):
    return ", ".join(f"`{RESULTS}/{r}`" for r in rels)


def machine_name(m):
    """The CPU as the benchmark recorded it: model name, x86 family and model numbers where kept,
    the instruction sets that decide the fast paths, and the logical CPUs."""
    if not m:
        return "machine not recorded"
    ident = m.get("cpu", "unknown CPU")
    if m.get("family") not in (None, "?") and m.get("model") not in (None, "?"):
        ident += f" (family {m['family']} model {m['model']})"
    isa = ", ".join(m.get("isa", []))
    cores = m.get("cores", m.get("logical_cpus"))
    return f"{ident}, {cores} logical CPUs" + (f", {isa}" if isa else "")


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(v, bold=False):
    if v is None:
        return "-"
    s = f"{v:.2f}x"
    return f"**{s}**" if bold else s


def table(head, aligns, rows):
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join(aligns) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# ---- training throughput (bench/train_throughput.py) ----
# Each column: (header, alignment, cell from a row, cell of the geometric-mean row from the file).
LAYOUT = {"channels_last": "NHWC", "nchw": "NCHW"}
THROUGHPUT_COLUMNS = {
    "eager": [
        ("duet ms/step", "---:", lambda r: fmt(r["duet_step_ms"]), lambda d: ""),
        ("PyTorch eager", "---:", lambda r: f"{fmt(r['torch_step_ms'])} ({LAYOUT[r['torch_layout']]})", lambda d: ""),
        ("speed-up", "---:", lambda r: ratio(r["speedup"], True), lambda d: ratio(d["geomean_speedup"], True)),
    ],
    "direct": [("direct conv only", "---:", lambda r: ratio(r.get("speedup_direct")),
                lambda d: ratio(d.get("geomean_speedup_direct")))],
    "autotune": [("autotuned", "---:", lambda r: ratio(r.get("speedup_autotune")),
                  lambda d: ratio(d.get("geomean_speedup_autotune")))],
    "compile": [
        ("torch.compile", "---:", lambda r: fmt(r.get("torch_compile_step_ms")), lambda d: ""),
        ("duet vs compile", "---:", lambda r: ratio(r.get("speedup_compile")),
         lambda d: ratio(d.get("geomean_speedup_compile"))),
    ],
    "bf16": [
        ("duet bf16", "---:", lambda r: fmt(r.get("duet_bf16_step_ms")), lambda d: ""),
        ("PyTorch bf16 autocast", "---:", lambda r: fmt(r.get("torch_bf16_step_ms")), lambda d: ""),
        ("bf16 speed-up", "---:", lambda r: ratio(r.get("speedup_bf16"), True),
         lambda d: ratio(d.get("geomean_speedup_bf16"), True)),
    ],
    "rss": [("peak RSS duet / PyTorch", "---:",
             lambda r: f"{r['duet_peak_rss_mib']:.0f} / {r['torch_peak_rss_mib']:.0f} MiB", lambda d: "")],
}
COLUMN_KEYS = {"direct": "speedup_direct", "autotune": "speedup_autotune", "compile": "speedup_compile",
               "bf16": "speedup_bf16"}


def model_label(r):
    label = f"{r['model']}, {r['image_size']} px"
    return label + (f", {r['classes']} classes" if r["classes"] != 10 else "")


def throughput(rel, columns=None, geomean=True):
    d = load(rel)
    rows = d["rows"]
    if columns is None:  # every column the run measured
        columns = ["eager"] + [c for c in ("direct", "autotune", "compile", "bf16")
                               if any(COLUMN_KEYS[c] in r for r in rows)] + ["rss"]
    cols = [c for name in columns for c in THROUGHPUT_COLUMNS[name]]
    batch = {r["batch"] for r in rows}
    body = [[model_label(r)] + [c[2](r) for c in cols] for r in rows]
    if geomean:
        body.append(["geometric mean"] + [c[3](d) for c in cols])
    out = table([f"model (batch {'/'.join(map(str, sorted(batch)))})"] + [c[0] for c in cols],
                ["---"] + [c[1] for c in cols], body)
    return out + ["", f"{machine_name(d.get('machine'))}; {d['threads']} threads, median of {d['rounds']} "
                      f"round{'s' if d['rounds'] > 1 else ''}, {d['date']}; {source(rel)}."]


# ---- single ops against PyTorch (bench/compare_ops.py) and the GEMM ceiling (bench/ceiling.py) ----
def compare_ops(rel, entries=None, lowest=0):
    d = load(rel)
    speed = {k: d["torch_s"][k] / d["duet_s"][k] for k in d["duet_s"] if k in d["torch_s"]}
    geo = math.exp(sum(math.log(v) for v in speed.values()) / len(speed))
    picked = list(entries or []) + [k for k, _ in sorted(speed.items(), key=lambda kv: kv[1])[:lowest]]
    body = [[f"`{k}`", f"{d['duet_s'][k] * 1e6:.0f}", f"{d['torch_s'][k] * 1e6:.0f}", ratio(speed[k])]
            for k in picked]
    body.append([f"geometric mean over {len(speed)} benchmarks", "", "",
                 ratio(geo, True) + f" (below 0.9x: {sum(v < 0.9 for v in speed.values())})"])
    return table(["benchmark", "duet µs", "PyTorch µs", "speed-up"], ["---", "---:", "---:", "---:"], body) + [
        "", f"PyTorch {d['torch_version']}; machine not recorded in the file; {source(rel)}."]


def ceiling(rel):
    d = load(rel)
    ceil = d["ceiling_gflops"]
    names = []
    for k in d["fraction"]:
        base = k.replace("_fwdbwd/", "/").replace("_fwd/", "/")
        if base not in names:
            names.append(base)
    body = []
    for base in names:
        op, shape = base.split("/", 1)
        cells = []
        for phase in ("fwd", "fwdbwd"):
            v = d["fraction"].get(f"{op}_{phase}/{shape}")
            cells.append("-" if v is None else f"{statistics.median(v) * 100:.0f}%")
        body.append([f"{op} {shape}"] + cells)
    return table(["entry", "forward", "forward + backward"], ["---", "---:", "---:"], body) + [
        "", f"Median over {len(ceil)} rounds of each entry's GFLOP/s over the 2048^3 product's in the same round "
            f"(that ceiling: {min(ceil):.0f}-{max(ceil):.0f} GFLOP/s, median {statistics.median(ceil):.0f}); "
            f"{d['threads']} threads; machine not recorded in the file; {source(rel)}."]


# ---- oneDNN 2.6 against newer oneDNN (bench/onednn_versions.py) ----
def onednn_versions(*rels):
    files = [(r, load(r)) for r in rels]
    head, cols = ["one step's convolutions, ms"], []
    for _, d in files:
        head += [d["base_version"], d["other_version"]]
    body = []
    for dtype in ("f32", "bf16"):
        per_pass, total = [], []
        for _, d in files:
            sums = {}
            for r in d["rows"]:
                if r["dtype"] == dtype:
                    for side in ("base", "other"):
                        key = (r["pass"], side)
                        sums[key] = sums.get(key, 0.0) + r["count"] * r[f"{side}_ms"]
            t = d["totals"][dtype]
            for side in ("base", "other"):
                per_pass.append(" / ".join(f"{sums[(p, side)]:.1f}" for p in ("fwd", "bwd-data", "bwd-weights")))
            total += [f"{t['base_ms']:.1f}", f"**{t['other_ms']:.1f} ({t['other_over_base']:.2f}x)**"]
        body.append([f"{dtype} forward / data / weight gradient"] + per_pass)
        body.append([f"{dtype}, all three"] + total)
    machines = {machine_name(d.get("machine")) for _, d in files}
    d0 = files[0][1]
    return table(head, ["---"] + ["---:"] * (len(head) - 1), body) + [
        "", f"{'; '.join(sorted(machines))}; {d0['threads']} threads, batch {d0['batch']}, median of {d0['rounds']} "
            f"alternated runs; {source(*rels)}."]


# ---- data-parallel training (bench/dist_overlap.py, bench/dist_cost_model.py) ----
def grad_mb(model, throughput_rel="train_throughput.json"):
    rows = {r["model"]: r for r in load(throughput_rel)["rows"]}
    return 4 * rows[model]["duet_parameters"] / 1e6  # f32 gradients


def dist_overlap(*rels):
    body, cpus = [], set()
    for rel in rels:
        d = load(rel)
        cpus.add(f"{d['cpu']}, {d.get('cores', d.get('logical_cpus'))} logical CPUs")
        bucket = d["args"]["bucket_mb"]
        for r in d["rows"]:
            mb = grad_mb(r["model"])
            body.append([f"{r['model']} ({mb:.1f} MB of gradients)", f"{bucket:g} MB ({math.ceil(mb / bucket)})",
                         f"{r['ranks_images_per_s'] / r['one_images_per_s']:.2f}",
                         f"{r['torch_ranks_images_per_s'] / r['torch_one_images_per_s']:.2f}",
                         f"{r['one_images_per_s'] / r['torch_one_images_per_s']:.2f}",
                         f"{r['ranks_images_per_s'] / r['torch_ranks_images_per_s']:.2f}",
                         f"{r['all_reduce_ms']:.1f}", f"{r['hidden_ms']:.1f}", f"{r['comm_exposed_ms']:.1f}"])
    body.sort(key=lambda row: (row[0].split()[0], -float(row[1].split()[0])))
    head = ["model", "buckets", "duet: 2 ranks / 1 process", "PyTorch: DDP / 1 process", "duet / PyTorch, 1 process",
            "duet / PyTorch, 2 ranks", "all-reduce ms/step", "hidden behind backward", "exposed ms/step"]
    return table(head, ["---", "---"] + ["---:"] * 7, body) + [
        "", f"{'; '.join(sorted(cpus))}; gradient sizes from the parameter counts of "
            f"{source('train_throughput.json')}; {source(*rels)}."]


def dist_cost_model(throughput_rel="train_throughput.json", step_scale=1.0, ranks=(2, 8, 64),
                    links=("10 GbE", "100 GbE")):
    spec = importlib.util.spec_from_file_location("dist_cost_model", os.path.join(REPO, "bench", "dist_cost_model.py"))
    cm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cm)  # the model's formula and link figures, written once in bench/
    d = load(throughput_rel)
    links = {name: cm.LINKS[name] for name in links}
    body = []
    for r in d["rows"]:
        size = 4 * r["duet_parameters"]
        t = r["duet_step_ms"] / 1e3 / step_scale
        k = max(1, math.ceil(size / 25e6))
        for i, (name, (bw, lat)) in enumerate(links.items()):
            cells = []
            for n in ranks:
                T = cm.all_reduce_s(n, size, k, bw, lat)
                cells.append(f"{t / (t + T):.0%} / {t / (t + max(T - 2 / 3 * t, T / k)):.0%}")
            first = i == 0
            body.append([r["model"] + (f", {r['image_size']} px" if first else ""),
                         f"{size / 1e6:.1f} MB" if first else "", f"{t * 1e3:.0f} ms" if first else "", name] + cells)
    return table(["model", "gradients", "step", "link"] + [f"{n} ranks" for n in ranks],
                 ["---", "---:", "---:", "---"] + ["---:"] * len(ranks), body) + [
        "", f"Efficiency without / with overlap (buckets of 25 MB, backward 2/3 of a step); step times "
            + ("" if step_scale == 1 else f"divided by {step_scale:g}, ")
            + f"measured on {machine_name(d.get('machine'))}, {d['date']}; {source(throughput_rel)}; "
            "the formula and link figures of `bench/dist_cost_model.py`."]


def dist_hosts(rel):
    """bench/dist_hosts.py: two hosts (network namespaces), one rank each, the link throttled."""
    d = load(rel)
    body = []
    for r in d["rows"]:
        link = {"off": "unthrottled"}.get(r["rate"], r["rate"].replace("gbit", " Gbit/s"))
        body.append([link, f"{r['bucket_mb']:g} MB ({r['buckets']})", f"{r['mpi_bus_gbs']:.2f}", fmt(r["bus_gbs"], 2),
                     f"{r['backward_ms']:.0f}", f"{r['all_reduce_ms']:.0f}", f"**{r['exposed_ms']:.0f}**",
                     f"{r['predicted_exposed_ms_original']:.0f}", f"{r['predicted_exposed_ms']:.0f}"])
    head = ["link", "buckets", "MPI all-reduce bus GB/s", "duet all-reduce bus GB/s", "backward ms",
            "all-reduce ms/step", "exposed ms/step", "predicted: table's formula", "predicted: queued buckets"]
    lb, la = d["load_before"], d["load_after"]
    return table(head, ["---", "---"] + ["---:"] * 7, body) + [
        "", f"{d['model']}, batch {d['batch_per_rank']} per rank, {d['ranks']} ranks on {d['hosts']} hosts of "
            f"{d['cpus_per_host']} CPU each, median of {d['repeats']} runs of {d['steps']} steps; "
            f"{machine_name(d.get('machine'))}; load average {lb[0]:.1f} before, {la[0]:.1f} after; {d['date']}; "
            f"{source(rel)}."]


# ---- inference (bench/infer_throughput.py) ----
def inference(rel):
    """duet's eval-mode passes against PyTorch eager, torch.compile and ONNX Runtime on duet's export."""
    d = load(rel)
    body = []
    for r in d["rows"]:
        def ms(v):
            return "-" if v is None else f"{v * 1e3:.2f}"
        best = r.get("best_peer_s")
        body.append([r["model"], r["dtype"], str(r["batch"]), f"**{ms(r['duet_s'])}**", ms(r.get("torch_s")),
                     ms(r.get("compile_s")), ms(r.get("ort_s")),
                     ratio(best / r["duet_s"] if best else None),
                     f"{r['duet_s'] / r['batch'] * 1e3:.2f}" if r["batch"] == 1 else f"{r['batch'] / r['duet_s']:.0f}"])
    loads = [x for r in d["rows"] for x in (r["load_before"], r["load_after"])]
    return table(["model", "dtype", "batch", "duet ms", "PyTorch eager ms", "torch.compile ms", "ONNX Runtime ms",
                  "duet vs the best other", "duet: ms per image (batch 1) / images/s"],
                 ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"], body) + [
        "", f"The median of {d['steps']} passes after {d['warmup']} warm-up, {d['threads']} threads, PyTorch with the faster "
            f"of NCHW and channels-last; ONNX Runtime in f32 only (no bf16 convolutions on its CPU provider); "
            f"{machine_name(d.get('machine'))}; load average {min(loads):.1f}-{max(loads):.1f}; "
            f"{d.get('date', 'date not recorded')}; {source(rel)}."]


# ---- one build against another (bench/compare_builds.py) ----
def compare_builds(rel):
    """Two builds of duet alternated on the same rows: the median step of each and their ratio."""
    d = load(rel)
    body = [[r["model"], str(r["batch"]), f"{r['a_median_s'] * 1e3:.2f}", f"{r['b_median_s'] * 1e3:.2f}",
             ratio(r["a_over_b"], bold=r["a_over_b"] >= 1.05)] for r in d["rows"]]
    loads = [x for r in d["rows"] for x in (r["load_before"], r["load_after"])]
    what = "eval-mode forward passes" if d["inference"] else "training steps"
    return table(["model", "batch", f"{d['a']} ms", f"{d['b']} ms", f"{d['a']} / {d['b']}"],
                 ["---", "---:", "---:", "---:", "---:"], body) + [
        "", f"{what.capitalize()} ({'bf16' if d['amp'] == 'bf16' else 'f32'}), `duet profile --mode throughput`, the "
            f"median over {d['rounds']} alternated rounds of each build's median step, {d['threads']} threads; "
            f"{machine_name(d.get('machine'))}; load average {min(loads):.1f}-{max(loads):.1f}; {source(rel)}."]


# ---- accuracy in 10 minutes (bench/train_accuracy.py) ----
def accuracy(rel="train_accuracy/summary.json"):
    d = load(rel)
    name = {"duet": "duet", "torch": "PyTorch"}
    body = []
    for task, spec in d["tasks"].items():
        label = {"cifar10": "CIFAR-10", "catdog": "cat/dog"}.get(task, task)
        label += f": {spec['model']} x{spec['width_mult']:g}, {spec['image_size']} px, {spec['epochs']} epochs"
        for i, r in enumerate(x for x in d["results"] if x["task"] == task):
            row = [label if i == 0 else "", name.get(r["framework"], r["framework"]),
                   f"{r['train_minutes']:.1f} min", f"{r['images_per_s']:.0f}", f"{r['final_acc'] * 100:.2f}%",
                   f"{r['minutes_to_target']:.1f} ({r['target'] * 100:.0f}%)"
                   if r["minutes_to_target"] is not None else f"not reached ({r['target'] * 100:.0f}%)"]
            if d.get("val_fraction"):  # runs with a validation split: the test split once, at the best epoch
                row.append(f"{r['test_acc'] * 100:.2f}% (epoch {r['test_epoch']})" if "test_acc" in r else "-")
            body.append(row)
    if d.get("val_fraction"):
        return table(["task", "framework", "training time", "images/s", "final validation accuracy",
                      "minutes to target (validation)", "test accuracy, once (best epoch on validation)"],
                     ["---", "---", "---:", "---:", "---:", "---:", "---:"], body) + [
            "", f"{d['threads']} threads, a {d['minutes']:g}-minute budget, one seed, {d['val_fraction']:g} of the "
                f"training set held out for validation; machine not recorded in the file (its NOTES.md names it); "
                f"{source(rel)}."]
    return table(["task", "framework", "training time", "images/s", "final test accuracy", "minutes to target"],
                 ["---", "---", "---:", "---:", "---:", "---:"], body) + [
        "", f"{d['threads']} threads, a {d['minutes']:g}-minute budget, one seed; machine not recorded in the file "
            f"(its NOTES.md names it); {source(rel)}."]


ATTN = ["gelu_fwd/vit_64x65x768", "gelu_fwdbwd/vit_64x65x768", "matmul_fwd/vit_attn_qk_192x65x64x65",
        "matmul_fwdbwd/vit_attn_qk_192x65x64x65", "linear_fwdbwd/vit_qkv_4160x192x576"]
ZEN5_FULL = "train_throughput_zen5_full_cd02f7c.json"
TABLES = {
    # the README's one table, and the latest full run of each CPU
    "readme_throughput": (throughput, (ZEN5_FULL,), {"columns": ["eager", "compile", "bf16", "rss"]}),
    "throughput_zen5": (throughput, (ZEN5_FULL,), {}),
    "throughput_zen4": (throughput, ("train_throughput.json",), {}),
    "throughput_zen3": (throughput, ("train_throughput_zen3_50f2f40.json",), {}),
    "throughput_amx": (throughput, ("train_throughput_amx_fb00fa5.json",), {}),
    "throughput_amx_compile": (throughput, ("train_throughput_amx_240f93a.json",), {}),
    "throughput_amx_715cc82": (throughput, ("train_throughput_amx_715cc82.json",), {}),
    # earlier rounds, kept in docs/journal.md
    "throughput_zen5_d2c02cd": (throughput, ("train_throughput_zen5.json",), {}),
    "throughput_zen5_5b0ccf9": (throughput, ("train_throughput_zen5_full_5b0ccf9.json",), {}),
    "throughput_zen5_a7a2d92": (throughput, ("train_throughput_zen5_a7a2d92.json",), {}),
    "throughput_zen5_e221fb2": (throughput, ("train_throughput_zen5_resnets_e221fb2.json",), {"geomean": False}),
    "compare_ops": (compare_ops, ("compare_ops_2threads.json",), {"lowest": 5}),
    "compare_ops_attention": (compare_ops, ("compare_ops_2threads.json",), {"entries": ATTN}),
    "gemm_ceiling": (ceiling, ("ceiling_2threads.json",), {}),
    "onednn_versions": (onednn_versions, ("onednn_versions_zen5_2.6_vs_3.2.json",
                                          "onednn_versions_zen5_2.6_vs_3.13.json"), {}),
    "dist_overlap": (dist_overlap, ("dist_overlap.json", "dist_overlap_bucket4.json"), {}),
    "dist_cost_model": (dist_cost_model, (), {}),
    "dist_cost_model_gpu": (dist_cost_model, (), {"step_scale": 50.0, "links": ("100 GbE", "NVLink (H100)")}),
    "train_accuracy": (accuracy, (), {}),
    "dist_hosts": (dist_hosts, ("dist_hosts.json",), {}),
    "inference_amx": (inference, ("infer_throughput_amx_2b97e85.json",), {}),
    "inference_zen3": (inference, ("infer_throughput_zen3_84d81b7.json",), {}),
    "inference_zen3_direct": (inference, ("infer_throughput_zen3_cnn_6c12fb7.json",), {}),
    "compare_zen3_direct_infer": (compare_builds, ("compare_zen3_own_direct_infer.json",), {}),
    "compare_zen3_direct_train": (compare_builds, ("compare_zen3_own_direct_train.json",), {}),
    "throughput_zen3_direct": (throughput, ("train_throughput_zen3_cnn_f5ce9f4.json",), {}),
    "throughput_zen3_wgrad": (throughput, ("train_throughput_zen3_cnn_f8a1d1d.json",), {}),
    "compare_zen3_wgrad_train": (compare_builds, ("compare_zen3_own_wgrad_train.json",), {}),
    "throughput_zen3_winograd": (throughput, ("train_throughput_zen3_cnn_winograd.json",), {}),
    "inference_zen3_winograd": (inference, ("infer_throughput_zen3_winograd.json",), {}),
    "compare_zen3_winograd_train": (compare_builds, ("compare_zen3_own_winograd_train.json",), {}),
    "compare_zen3_winograd_infer": (compare_builds, ("compare_zen3_own_winograd_infer.json",), {}),
    "compare_zen3_winograd_wgrad_blocked": (compare_builds, ("compare_zen3_winograd_wgrad_blocked_train.json",), {}),
    "compare_zen3_skinny_avx2": (compare_builds, ("compare_zen3_skinny_avx2_infer.json",), {}),
    "compare_zen3_skinny_avx2_loads": (compare_builds, ("compare_zen3_skinny_avx2_loads_infer.json",), {}),
    "inference_zen3_b1_skinny": (inference, ("infer_throughput_zen3_b1_skinny.json",), {}),
    "compare_zen3_direct_matmul": (compare_builds, ("compare_zen3_direct_matmul_infer.json",), {}),
    "compare_zen3_direct_matmul_train": (compare_builds, ("compare_zen3_direct_matmul_train.json",), {}),
    "inference_zen3_b1_direct_matmul": (inference, ("infer_throughput_zen3_b1_direct_matmul.json",), {}),
    "inference_zen3_d23c259_b1": (inference, ("infer_throughput_zen3_d23c259_b1.json",), {}),
    "inference_zen3_d23c259_b8_64": (inference, ("infer_throughput_zen3_d23c259_b8_64.json",), {}),
    "throughput_zen5_d3ade82": (throughput, ("train_throughput_zen5_d3ade82.json",), {}),
    "throughput_zen5_bf16_a30f906": (throughput, ("train_throughput_zen5_bf16_a30f906.json",), {}),
    "compare_zen5_bn_relu6_gate_train": (compare_builds, ("compare_zen5_bn_relu6_gate_train.json",), {}),
    "compare_zen5_own_winograd_forward_infer": (compare_builds, ("compare_zen5_own_winograd_forward_infer.json",), {}),
    "compare_zen5_own_winograd_forward_train": (compare_builds, ("compare_zen5_own_winograd_forward_train.json",), {}),
    "inference_zen5_d3ade82_b1": (inference, ("infer_throughput_zen5_d3ade82_b1.json",), {}),
    "inference_zen5_d3ade82_b8_64": (inference, ("infer_throughput_zen5_d3ade82_b8_64.json",), {}),
    "compare_zen5_small_depthwise_infer": (compare_builds, ("compare_zen5_small_depthwise_infer.json",), {}),
    "compare_zen5_small_depthwise_train": (compare_builds, ("compare_zen5_small_depthwise_train.json",), {}),
    "inference_zen5_e67b049_b1": (inference, ("infer_throughput_zen5_e67b049_b1.json",), {}),
    "throughput_xeon207_64ab00b": (throughput, ("train_throughput_xeon207_64ab00b.json",), {}),
    "inference_xeon207_64ab00b_b1": (inference, ("infer_throughput_xeon207_64ab00b_b1.json",), {}),
    "inference_xeon207_64ab00b_b8_64": (inference, ("infer_throughput_xeon207_64ab00b_b8_64.json",), {}),
    "compare_xeon207_bf16_winograd_train": (compare_builds, ("compare_xeon207_bf16_winograd_train.json",), {}),
    "throughput_xeon207_bf16_winograd": (throughput, ("train_throughput_xeon207_bf16_winograd.json",), {}),
    "compare_xeon207_bf16_all_f32_train": (compare_builds, ("compare_xeon207_bf16_all_f32_train.json",), {}),
    "compare_xeon207_bf16_in_f32_train": (compare_builds, ("compare_xeon207_bf16_in_f32_train.json",), {}),
    "throughput_xeon207_bf16_in_f32": (throughput, ("train_throughput_xeon207_bf16_in_f32.json",), {}),
    "inference_xeon207_e6d2b37_b8_64": (inference, ("infer_throughput_xeon207_e6d2b37_b8_64.json",), {}),
    "inference_xeon207_e6d2b37_b64_rerun": (inference, ("infer_throughput_xeon207_e6d2b37_b64_rerun.json",), {}),
    "inference_xeon207_edaefd8_b1": (inference, ("infer_throughput_xeon207_edaefd8_b1.json",), {}),
    "inference_fold_amx": (inference, ("infer_throughput_amx_33acfea.json",), {}),
    "inference_pack_amx": (inference, ("infer_throughput_amx_b6b2de2.json",), {}),
    "inference_bf16_amx": (inference, ("infer_throughput_amx_bf16_77e36f9.json",), {}),
    "compare_pack_amx": (compare_builds, ("compare_amx_dd73c2a_b6b2de2_infer.json",), {}),
    "inference_overhead_amx": (inference, ("infer_throughput_amx_16fc1a1.json",), {}),
    "compare_overhead_amx": (compare_builds, ("compare_amx_b7a9d60_16fc1a1_infer.json",), {}),
    "inference_alloc_amx": (inference, ("infer_throughput_amx_8b59534.json",), {}),
    "compare_alloc_amx": (compare_builds, ("compare_amx_78f2bcc_8b59534_infer.json",), {}),
    "inference_skinny_amx": (inference, ("infer_throughput_amx_95988e1.json",), {}),
    "compare_skinny_amx": (compare_builds, ("compare_amx_2cdde74_95988e1_infer.json",), {}),
    "inference_full_amx": (inference, ("infer_throughput_amx_7186038.json",), {}),
}


def data_files(name):
    fn, args, _ = TABLES[name]
    files = [a for a in args if a.endswith(".json")] or {
        "dist_cost_model": ["train_throughput.json"], "accuracy": ["train_accuracy/summary.json"]}[fn.__name__]
    return ", ".join(f"{RESULTS}/{f}" for f in files)


def render(name):
    fn, args, kwargs = TABLES[name]
    return fn(*args, **kwargs)


def pages(root):
    return [p for p in [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
            if os.path.exists(p)]


def blocks(text, path):
    """(name, first line index inside, end line index) of every marked table; malformed markers are errors."""
    lines, found, open_at = text.split("\n"), [], None
    for i, line in enumerate(lines):
        m = BEGIN.match(line)
        if m:
            if open_at is not None:
                raise SystemExit(f"{path}:{i + 1}: table '{m.group(1)}' begins inside table '{open_at[0]}'")
            if m.group(1) not in TABLES:
                raise SystemExit(f"{path}:{i + 1}: unknown table '{m.group(1)}' (known: {', '.join(sorted(TABLES))})")
            open_at = (m.group(1), i + 1)
        elif line == END:
            if open_at is None:
                raise SystemExit(f"{path}:{i + 1}: {END} without a BEGIN")
            found.append((open_at[0], open_at[1], i))
            open_at = None
    if open_at is not None:
        raise SystemExit(f"{path}:{open_at[1]}: table '{open_at[0]}' has no {END}")
    return found


def process(root, check):
    """Rewrites (or, with check, compares) every marked table under root; returns the problems."""
    problems, cache = [], {}
    for path in pages(root):
        with open(path) as f:
            text = f.read()
        lines = text.split("\n")
        rel = os.path.relpath(path, root)
        for name, start, end in reversed(blocks(text, rel)):
            want = cache.setdefault(name, render(name))
            have = lines[start:end]
            if have == want:
                continue
            if check:
                n = next((i for i in range(max(len(have), len(want)))
                          if i >= len(have) or i >= len(want) or have[i] != want[i]))
                problems.append(f"{rel}:{start + n + 1}: table '{name}' differs from its data "
                                f"({data_files(name)}):\n"
                                f"  page: {have[n] if n < len(have) else '(table ends)'}\n"
                                f"  data: {want[n] if n < len(want) else '(table ends)'}")
            else:
                lines[start:end] = want
                problems.append(f"{rel}: table '{name}' rewritten")
        if not check and "\n".join(lines) != text:
            with open(path, "w") as f:
                f.write("\n".join(lines))
    return problems


def self_test():
    """A drifted number must fail --check, naming the table; the untouched copy must pass."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(REPO, "README.md"), tmp)
        shutil.copytree(os.path.join(REPO, "docs"), os.path.join(tmp, "docs"))
        run = lambda: subprocess.run([sys.executable, os.path.abspath(__file__), "--check", "--root", tmp],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        clean = run()
        assert clean.returncode == 0, f"--check fails on an unchanged copy:\n{clean.stdout}"
        planted = 0
        for path in pages(tmp):
            with open(path) as f:
                text = f.read()
            lines = text.split("\n")
            for name, start, end in blocks(text, path):
                for i in range(start + 2, end):  # the first number of a data row past its label: 12.3 -> 13.3
                    cells = lines[i].find("|", 1)
                    m = re.compile(r"(\d)\.\d").search(lines[i], cells) if cells > 0 else None
                    if m:
                        digit = str((int(m.group(1)) + 1) % 10)
                        lines[i] = lines[i][:m.start(1)] + digit + lines[i][m.start(1) + 1:]
                        with open(path, "w") as f:
                            f.write("\n".join(lines))
                        drifted = run()
                        print(drifted.stdout, end="")
                        assert drifted.returncode == 1, f"--check passed a drifted '{name}' in {path}"
                        assert f"table '{name}'" in drifted.stdout and lines[i] in drifted.stdout, drifted.stdout
                        with open(path, "w") as f:
                            f.write(text)
                        planted += 1
                        break
                break  # one table per page is enough
        assert planted, "no marked table with a number to drift"
    print(f"self-test: --check caught a drifted number in {planted} page(s) and passed the unchanged copy")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a table differs from its data")
    ap.add_argument("--list", action="store_true", help="list the tables, their data and the pages that use them")
    ap.add_argument("--self-test", action="store_true", help="check that --check catches a planted drift")
    ap.add_argument("--root", default=REPO, help="where README.md and docs/ are (the data is always this repository's)")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    if a.list:
        used = {}
        for path in pages(a.root):
            with open(path) as f:
                for name, _, _ in blocks(f.read(), path):
                    used.setdefault(name, []).append(os.path.relpath(path, a.root))
        for name in TABLES:
            print(f"{name:26} {data_files(name):80} {', '.join(used.get(name, ['(unused)']))}")
        return 0
    problems = process(a.root, a.check)
    for p in problems:
        print(p)
    if a.check:
        if problems:
            print(f"{len(problems)} table(s) differ from bench/results: run python3 scripts/doc_tables.py")
            return 1
        print("every marked table matches bench/results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
