#!/usr/bin/env python3
"""Study 3: CNNs against transformers, per operator. ConvNeXt-T, ViT-B/16 and DeiT-tiny at 224 px
(the question of a study that listed each model's top operators by self and total time with
torch.profiler, e.g. addmm, bmm, copy and gelu for ViT on a CPU, and plotted duration against batch
size): duet's per-op tables of a training step of each model, the share of time by kind of op, the
step and forward duration against the batch size, and sharded inference with `duet predict` under
mpirun (docs/distributed.md).

  .venv-bench/bin/python studies/cnn_vs_transformer.py                    # the study (about 8 minutes on 2 cores)
  .venv-bench/bin/python studies/cnn_vs_transformer.py --device cpu,cuda  # and on the GPU, where there is one
  .venv-bench/bin/python studies/cnn_vs_transformer.py --quick            # seconds: 32 px, tiny widths

Shortened for 2 cores: per-op profiles are --steps (3) steps at batch --profile-batch (8) after one
warm-up step, on generated data (`duet profile`); the duration sweep is batch 1 to 32, 3 steps each;
the inference model is trained for one epoch on 32 photos only to have a checkpoint to predict with
(its accuracy is not the point), then classifies the 300 test photos on one process and on two.
"""
import filecmp
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import studylib as sl  # noqa: E402

STUDY = "cnn_vs_transformer"
SCRIPT = "cnn_vs_transformer.py"
def kind_shares(report):
    convs = sl.conv_weights_by_scope(report)
    tot = {}
    for o in report["op_records"]:
        k = sl.op_kind(o["name"], o["phase"], o["scope"], convs)
        tot[k] = tot.get(k, 0) + o["self_ns"]
    s = sum(tot.values()) or 1
    return {k: v / s for k, v in tot.items()}, tot


def module_totals(report, top):
    """Time per kind of module (module paths with their indices folded), forward and backward together:
    the analogue of torch.profiler's total time of a module-level entry."""
    nsteps = len(report["steps"]) or 1
    agg = {}
    for row in report["layer_table"]:
        k = sl.layer_kind(row["key"])
        a = agg.setdefault(k, {"ns": 0, "ops": set(), "calls": 0})
        a["ns"] += row["self_ns"]
        a["ops"].update(row["ops"].split("+"))
        a["calls"] += row["calls"]
    total = sum(v["ns"] for v in agg.values()) or 1
    rows = sorted(agg.items(), key=lambda kv: -kv[1]["ns"])[:top]
    return [(k, v["ns"] / nsteps / 1e6, v["ns"] / total, sorted(v["ops"])) for k, v in rows]


def main():
    ap = sl.common_args(STUDY, __doc__)
    ap.add_argument("--models", default="convnext_tiny,vit_b_16,deit_tiny")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--profile-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batches", default="1,2,4,8,16,32", help="the duration-against-batch sweep")
    ap.add_argument("--predict-model", default="deit_tiny", help="the model of the sharded-inference part ('' to skip)")
    ap.add_argument("--predict-images", type=int, default=300, help="test photos to classify (the first of each class)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    width = []
    if a.quick:
        a.image_size, a.profile_batch, a.steps, a.batches, a.predict_images = 32, 2, 1, "2", 8
        width = ["--width-mult", "0.25"]
    argv = sys.argv[1:]
    models = [m for m in a.models.split(",") if m]
    batches = [int(b) for b in a.batches.split(",")]
    machine, devs, duet = sl.start(a)
    probes = {d: duet.probe(d) for d in devs}

    def model_args(m):
        # ViTs at other sizes than their default need the patch grid to match: quick mode's 32 px keeps patch 16
        return ["--model", m, "--image-size", a.image_size] + width

    per_op, sweep = {}, {}
    for d in devs:
        dn = d.replace(":", "")
        for m in models:
            out = os.path.join(duet.work, f"{dn}_{m}.json")
            duet.run(["profile"] + model_args(m) + ["--batch", a.profile_batch, "--steps", a.steps, "--warmup", 1,
                                                    "--mode", "per-op", "--out", out], f"{dn}_{m}", device=d,
                     fresh=(out,))
            per_op[(d, m)] = sl.load_report(out)
            for b in batches:
                out = os.path.join(duet.work, f"{dn}_{m}_b{b}.json")
                rc, text, _ = duet.run(["profile"] + model_args(m) + ["--batch", b, "--steps", a.steps, "--warmup", 1,
                                                                      "--mode", "throughput", "--out", out],
                                       f"{dn}_{m}_b{b}", device=d, check=False, fresh=(out,))
                sweep[(d, m, b)] = sl.load_report(out) if rc == 0 else {"error": (text.strip().splitlines() or ["?"])[-1]}

    # ---- sharded inference ----
    infer = None
    if a.predict_model:
        infer = sharded_inference(a, duet, width)
    machine.finish(duet.work, a.replot)
    reports = list(per_op.values()) + [r for r in sweep.values() if "error" not in r]
    plt = sl.plt()

    # ---- top ops per model ----
    top_md = ""
    for d in devs:
        for m in models:
            rep = per_op[(d, m)]
            nsteps = len(rep["steps"])
            rows = []
            for o in rep["op_table"][:a.top]:
                rows.append([f"`{o['key']}`", o["phase"], sl.f(o["self_ns"] / nsteps / 1e6, 1),
                             sl.f(o["total_ns"] / nsteps / 1e6, 1), sl.pct(o["pct"]), o["calls"] // nsteps,
                             sl.f(o["gflops"], 1) if o["flops"] else "-",
                             sl.f(o["flop_per_byte"], 1) if o["flop_per_byte"] else "-", o["bound"] or "-",
                             sl.pct(o["roof_pct"], 0) if o["roof_pct"] is not None else "-",
                             (o["impl"] or "-").replace(",", ", ")])
            ph = sl.phase_ms(rep, skip_first=False, kind="ops")
            top_md += (f"\n**{m}** on {d}, batch {a.profile_batch}: step {sl.f(ph['step'], 0)} ms (forward "
                       f"{sl.f(ph['forward'], 0)}, backward {sl.f(ph['backward'], 0)}, optimizer "
                       f"{sl.f(ph['optimizer'], 0)}, outside ops {sl.f(ph['untracked'], 0)}), "
                       f"{rep['run_config'].get('parameters', 0) / 1e6:.1f}M parameters\n\n")
            top_md += sl.md_table(["op", "phase", "self ms/step", "total ms/step", "% step", "calls/step", "GFLOP/s",
                                   "FLOP/byte", "bound", "% of roof", "implementation"], rows, right={2, 3, 4, 5, 6, 7, 9})

    # ---- totals by module ----
    mod_md = ""
    for d in devs:
        for m in models:
            rows = [[f"`{k}`", sl.f(ms, 1), sl.pct(share), ", ".join(ops)]
                    for k, ms, share, ops in module_totals(per_op[(d, m)], 8)]
            mod_md += f"\n**{m}** on {d}\n\n" + sl.md_table(["module (indices folded)", "total ms/step", "% of op time",
                                                             "ops inside"], rows, right={1, 2})

    # ---- kinds ----
    kinds = {}
    for d in devs:
        for m in models:
            kinds[(d, m)] = kind_shares(per_op[(d, m)])[0]
    order = [k for k in sl.KIND_COLORS if any(k in v for v in kinds.values())]
    krows = [[k] + [sl.pct(kinds[(d, m)].get(k, 0)) for d in devs for m in models] for k in order]
    kinds_md = sl.md_table(["kind of op"] + [f"{m} ({d})" for d in devs for m in models], krows)

    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.55 * len(kinds)))
    labels = [f"{m}\n{d}" for d in devs for m in models]
    for i, key in enumerate([(d, m) for d in devs for m in models]):
        left = 0
        for k in order:
            v = kinds[key].get(k, 0) * 100
            ax.barh(i, v, left=left, color=sl.KIND_COLORS[k], label=k if i == 0 else None)
            if v >= 6:
                ax.text(left + v / 2, i, f"{v:.0f}", ha="center", va="center", fontsize=7)
            left += v
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"% of op time in a training step (batch {a.profile_batch}, {a.image_size} px)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    sl.savefig(fig, os.path.join(a.out, "op_kinds.png"))

    # ---- duration against batch ----
    srows = []
    fig, axs = plt.subplots(1, 2, figsize=(11, 4))
    for d in devs:
        for m in models:
            bs, fwd, step = [], [], []
            for b in batches:
                r = sweep[(d, m, b)]
                if "error" in r:
                    srows.append([m, d, b, "failed: " + r["error"], "", "", "", ""])
                    continue
                w = sl.phase_ms(r, skip_first=False, kind="wall")  # `duet profile` ran a warm-up step already
                bs.append(b)
                fwd.append(w["forward"])
                step.append(w["step"])
                srows.append([m, d, b, sl.f(w["forward"], 1), sl.f(w["step"], 1), sl.f(w["forward"] / b, 1),
                              sl.f(w["step"] / b, 1), sl.f(b / w["step"] * 1000, 1)])
            if bs:
                axs[0].plot(bs, fwd, "o-", label=f"{m} ({d}) forward")
                axs[0].plot(bs, step, "s--", color=axs[0].lines[-1].get_color(), alpha=0.6, label=f"{m} ({d}) step")
                axs[1].plot(bs, [s / b for s, b in zip(step, bs)], "o-", label=f"{m} ({d})")
    for ax in axs:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(batches)
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axs[0].set_ylabel("ms (forward phase; whole training step dashed)")
    axs[1].set_ylabel("ms per image (training step)")
    from matplotlib.ticker import ScalarFormatter
    for ax in axs:
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=6)
    fig.subplots_adjust(wspace=0.3)
    fig.suptitle(f"duration against batch size, {a.image_size} px, throughput mode, mean of {a.steps} timed steps "
                 f"after 1 warm-up step", fontsize=9)
    sl.savefig(fig, os.path.join(a.out, "duration_vs_batch.png"))
    sweep_md = sl.md_table(["model", "device", "batch", "forward ms", "step ms", "forward ms/image", "step ms/image",
                            "training images/s"], srows, right={2, 3, 4, 5, 6, 7})

    # ---- write ----
    load = sl.load_verdict(reports, machine.logical_cpus)
    pp = sl.probe_point(probes[devs[0]], devs[0], a.threads)
    block = [
        machine.header(sl.command_line(SCRIPT, argv)),
        f"Models {', '.join(models)} at {a.image_size} px, 1000 classes, SGD, generated data resident in memory "
        f"(`duet profile`). Load: {load}. Roofline ceilings (`duet probe`, this run): GEMM {pp['gemm_gflops']:.0f} GFLOP/s, "
        f"copy {pp['copy_gbs']:.1f} GB/s, ridge {pp['gemm_gflops'] / pp['copy_gbs']:.1f} FLOP/byte.\n",
        f"### Top {a.top} operators by self time, per model\n",
        "Per-op timing, all timed steps; self and total are equal for every duet op (its ops do not nest: a "
        "`linear` is one oneDNN matmul, not torch's `linear` -> `addmm` pair), so the table lists both once and "
        "the next one gives module totals.\n",
        top_md,
        "\n### Total time by module\n",
        "The layer table (module path and phase) with the block and layer indices folded together "
        "(`encoder.layers.encoder_layer_*.mlp.*`): a module's total is the self time of the ops inside it, forward "
        "and backward.\n",
        mod_md,
        "\n### Share of the step by kind of op\n", kinds_md,
        "![kinds of op](IMGDIR/op_kinds.png)\n",
        "### Duration against batch size\n", sweep_md,
        f"Throughput mode (no per-op events), mean of the {a.steps} timed steps after one warm-up step; `forward` is the "
        "forward phase of a training step (activations kept for backward), the closest duet has to inference "
        "time without a separate inference profile.\n",
        "![duration against batch](IMGDIR/duration_vs_batch.png)\n",
    ]
    if infer:
        block += ["### Sharded inference (`duet predict` under mpirun)\n", infer["md"]]
    block.append(f"{sl.sensors_note(reports)}.\n")
    text = "\n".join(block)
    summary = {"models": models, "image_size": a.image_size, "profile_batch": a.profile_batch, "wall_s": machine.wall_s,
               "cpu": machine.cpu, "threads": a.threads, "load": load, "probe": pp,
               "kinds": {f"{m} ({d})": v for (d, m), v in kinds.items()},
               "steps_ms": {f"{m} ({d})": sl.phase_ms(r, skip_first=False, kind="ops") for (d, m), r in per_op.items()},
               "sweep": {f"{m} ({d}) b{b}": (sl.phase_ms(r, skip_first=False, kind="wall") if "error" not in r else r)
                         for (d, m, b), r in sweep.items()},
               "inference": {k: v for k, v in (infer or {}).items() if k != "md"}}
    sl.publish(a, machine, STUDY, SCRIPT, text, summary, duet)


def sharded_inference(a, duet, width):
    """A checkpoint of --predict-model from one short epoch on photos, then `duet predict` on the test photos
    by one process (all threads) and by --ranks processes under mpirun (threads split between them)."""
    src = os.path.join(a.data, "cats_dogs")
    if not os.path.isdir(os.path.join(src, "test")):
        return {"md": f"Not run: no cat/dog photos at `{src}`.\n"}
    mpirun = sl.which("mpirun") or sl.which("mpiexec")
    m = a.predict_model
    photos = os.path.join(duet.work, "photos")
    if os.path.exists(photos):
        shutil.rmtree(photos)
    per_test = max(1, a.predict_images // 2)
    for split, per in (("train", 16), ("test", per_test)):
        for c in sorted(os.listdir(os.path.join(src, split))):
            if not os.path.isdir(os.path.join(src, split, c)):
                continue
            os.makedirs(os.path.join(photos, split, c))
            for fn in sorted(os.listdir(os.path.join(src, split, c)), key=lambda s: (len(s), s))[:per]:
                os.symlink(os.path.abspath(os.path.join(src, split, c, fn)), os.path.join(photos, split, c, fn))
    ck = os.path.join(duet.work, f"{m}_catdog.safetensors")
    duet.run(["train", "--model", m, "--dataset", "folder", "--data", photos, "--image-size", a.image_size] + width +
             ["--epochs", 1, "--batch", 16, "--checkpoint", ck], f"predict_train_{m}")
    test = os.path.join(photos, "test")
    n_images = sum(len(os.listdir(os.path.join(test, c))) for c in os.listdir(test))
    batch = 32
    res = {"model": m, "images": n_images, "batch": batch}
    one = os.path.join(duet.work, "predict_1.csv")
    _, text, wall1 = duet.run(["predict", "-c", ck, test, "--batch", batch, "--out", one], "predict_1")
    res["one"] = parse_predict(text, wall1)
    rows = [["1 process", a.threads, sl.f(res["one"]["seconds"], 2), sl.f(res["one"]["images_per_s"], 1),
             sl.f(wall1, 1), "-"]]
    note = ""
    if mpirun is None:
        note = "mpirun not found (Open MPI comes with ./scripts/setup.sh): the sharded run was not made.\n"
    else:
        env = {}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
            note = ("Run as root here, so the script set `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1` for "
                    "mpirun (docs/distributed.md).\n")
        many = os.path.join(duet.work, f"predict_{a.ranks}.csv")
        per_rank = max(1, a.threads // a.ranks)
        rc, text, wall2 = duet.run(["predict", "-c", ck, test, "--batch", batch, "--out", many], f"predict_{a.ranks}",
                                   threads=per_rank, launcher=[mpirun, "-np", str(a.ranks)], env=env, check=False)
        if rc != 0:
            note += f"The sharded run failed: `{(text.strip().splitlines() or ['?'])[-1]}`.\n"
        else:
            res["many"] = parse_predict(text, wall2)
            res["identical"] = filecmp.cmp(one, many, shallow=False)
            rows.append([f"{a.ranks} processes (mpirun)", f"{per_rank} each", sl.f(res["many"]["seconds"], 2),
                         sl.f(res["many"]["images_per_s"], 1), sl.f(wall2, 1),
                         "identical" if res["identical"] else "DIFFERENT"])
    md = (f"{m}, checkpoint from one epoch on 32 photos; {n_images} test photos, batch {batch} (rank r classifies "
          f"batches r, r + N, ...; one all-reduce gathers the results on rank 0).\n\n" +
          sl.md_table(["run", "threads", "inference s (duet's own clock)", "images/s", "process wall s",
                       "results against 1 process"], rows) +
          "\nduet's clock covers decoding, the transform and the forward passes (after the checkpoint is loaded); "
          "the wall time adds process start-up, loading the checkpoint and, under mpirun, starting the ranks.\n" + note)
    res["md"] = md
    return res


def parse_predict(text, wall):
    m = re.search(r"(\d+) images? in ([\d.]+) s \(([\d.]+) img/s\)", text)
    if not m:
        raise sl.StudyError("could not read the timing line of duet predict:\n" + text[-1000:])
    return {"images": int(m.group(1)), "seconds": float(m.group(2)), "images_per_s": float(m.group(3)), "wall_s": wall}


if __name__ == "__main__":
    sl.main_guard(main)
