#!/usr/bin/env python3
"""Where one pass's instructions go, counted rather than timed: valgrind's callgrind on
`duet profile`, run twice with different numbers of passes. The difference between the two runs,
divided by the extra passes, is one steady-state pass: the warm-up's first calls (primitives made,
weights folded and packed) are the same in both runs and cancel out. Only the step function is
counted (not building the model or writing the report).

Why counts: on a shared host a batch-1 pass of one build moved 1.5x between runs (docs/journal.md,
2026-11-30), so a change to the code around the kernels (dispatch, planning, allocation), worth a
few percent of a pass, is lost in a timed A/B. Instruction counts do not move with the host's
load. They are not time: a kernel waiting on memory spends more time per instruction than the code
around it, so the counts rank the glue and show what a change removed; the speed itself is
bench/compare_builds.py's.

The pass runs on one thread: with more, callgrind would count the OpenMP team's spinning, which
depends on timing; and only that thread is counted (not the profiler's telemetry sampler).
Instructions are grouped by where they run (duet's cpu backend, the rest of duet, oneDNN's library,
oneDNN's JIT-compiled kernels, the C library's allocator, the rest of the C library, the C++
runtime, ...) and the functions that run the most are listed. --compare B adds a second build's
counts and the difference.

  .venv-bench/bin/python bench/pass_instructions.py --duet build/duet --model mobilenet_v2 --batch 1
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import MODELS, machine  # noqa: E402

# Only the steps are counted: profile_batch's step lambdas (train/profile_steps.cpp), called through
# a std::function, so the report's work per step (its JSON) stays out.
STEP_FUNCTION = "std::_Function_handler<void (long), duet::app::profile_batch*"
# The exit status when valgrind cannot decode the binary's instructions (tests skip on it).
UNDECODABLE = 3


def valgrind_version():
    r = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
    return r.stdout.strip().removeprefix("valgrind-") or "(unknown version)"

# A line of callgrind_annotate's listing: "  232,964,480 (18.51%)  file:function [object]".
LINE = re.compile(r"^\s*([\d,]+)\s+\([\s\d.]+%\)\s+(.*?)\s+\[(.*)\]\s*$")


def group_of(function, obj, where=""):
    """Where the instructions of one function run (see the module's docstring); obj is the object
    file's name without its folder, where the source file callgrind names (glibc's malloc/malloc.c)."""
    if obj == "???":
        return "oneDNN JIT kernels"  # code generated at run time has no object file
    libraries = (("libdnnl", "oneDNN library"), ("libstdc++", "C++ runtime"), ("libgomp", "OpenMP runtime"),
                 ("libm.", "C math library"), ("ld-linux", "dynamic loader"))
    for prefix, name in libraries:
        if obj.startswith(prefix):
            return name
    if obj.startswith("libc."):
        return "C library: malloc and free" if "malloc/" in where else "C library: other"
    if ".so" in obj:
        return "other libraries"
    # duet's own binary: its cpu backend, and the rest (engine, nn, the templates they instantiate)
    # (a template's name starts with its return type: "void duet::cpu::...")
    return "duet: cpu backend" if re.search(r"(^|\s)duet::cpu::", function.split("(")[0]) else "duet: the rest"


def self_counts(out_file, binary):
    """{(function, object, group): self instructions} from one callgrind output file of `binary`."""
    r = subprocess.run(["callgrind_annotate", "--threshold=100", out_file], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"pass_instructions: callgrind_annotate failed:\n{r.stderr[-2000:]}")
    counts = {}
    in_listing = False
    for line in r.stdout.splitlines():
        if line.startswith("Ir") and "file:function" in line:
            in_listing = True
            continue
        m = LINE.match(line) if in_listing else None
        if not m:
            continue
        # Objects by file name, and the binary as "duet": two builds then name the same functions alike.
        where, obj = m.group(2), os.path.basename(m.group(3)) if m.group(3) != "???" else "???"
        obj = "duet" if obj == os.path.basename(binary) else obj
        # JIT code is named by its address, which differs between the two runs: one entry for all.
        function = "code generated at run time" if obj == "???" else where.split(":", 1)[1] if ":" in where else where
        key = (function, obj, group_of(function, obj, where))
        counts[key] = counts.get(key, 0) + int(m.group(1).replace(",", ""))
    return counts


def counted_run(duet, a, passes, folder, tag):
    """One `duet profile` under callgrind with `passes` timed passes; its self counts."""
    out = os.path.join(folder, f"callgrind.{tag}.{passes}")
    # One file per thread: only the calling thread's is read. The profiler's telemetry thread samples
    # on a clock, and under callgrind a pass takes about 50 times as long, so its work per pass
    # would be 50 times what it is.
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--toggle-collect={STEP_FUNCTION}",
           f"--callgrind-out-file={out}", duet, "profile", "--model", a.model,
           "--image-size", str(a.image_size), "--classes", str(a.classes), "--batch", str(a.batch), "--steps",
           str(passes), "--warmup", str(a.warmup), "--threads", "1", "--mode", "throughput", "--out",
           os.path.join(folder, "report.json")]
    if not a.training:
        cmd.append("--inference")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and "unhandled instruction bytes" in r.stderr:
        # valgrind's decoder stops at an instruction it does not know: Debian 12's 3.19 has no
        # AVX-512, which a -march=native build (DUET_NATIVE, the default) uses on such a CPU.
        print(f"pass_instructions: valgrind {valgrind_version()} cannot decode an instruction of {duet} (it has no "
              "AVX-512, which a -march=native build uses on this CPU). A build configured with -DDUET_NATIVE=OFF "
              "runs under it, on its AVX2 paths (valgrind reports no AVX-512): counts of those, not of this CPU's "
              "AVX-512 kernels", file=sys.stderr)
        sys.exit(UNDECODABLE)
    if r.returncode != 0:
        sys.exit(f"pass_instructions: {' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    counts = self_counts(out + "-01", os.path.realpath(duet))  # thread 1: the one that runs the passes
    if not counts:
        sys.exit(f"pass_instructions: nothing was counted inside {STEP_FUNCTION!r}: has the step function of "
                 "train/profile_steps.cpp (profile_batch's lambdas) changed?")
    return counts


def per_pass(duet, a, folder, tag):
    """{(function, object, group): instructions in one steady-state pass}: the two runs' difference."""
    few = counted_run(duet, a, a.passes, folder, tag)
    many = counted_run(duet, a, 2 * a.passes, folder, tag)
    return {k: (many.get(k, 0) - few.get(k, 0)) / a.passes for k in set(few) | set(many)}


def short(function, width=100):
    """A function's name without its parameter list, cut to width."""
    depth, cut = 0, len(function)
    for i, ch in enumerate(function):  # the parameter list is the last top-level (...)
        if ch == "(" and depth == 0:
            cut = i
        depth += ch in "(<"
        depth -= ch in ")>"
    name = function[:cut] if cut < len(function) else function
    return name if len(name) <= width else name[: width - 3] + "..."


def groups(counts):
    g = collections.Counter()
    for (_, _, group), n in counts.items():
        g[group] += n
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default="build/duet")
    ap.add_argument("--compare", help="a second duet binary, counted the same way")
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--image-size", type=int, help="bench/train_throughput.py's size for the model when not given")
    ap.add_argument("--classes", type=int, help="bench/train_throughput.py's classes for the model when not given")
    ap.add_argument("--training", action="store_true", help="training steps instead of eval-mode passes")
    ap.add_argument("--passes", type=int, default=20, help="the first run's passes; the second runs twice as many")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    a = ap.parse_args()
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            sys.exit(f"pass_instructions: {tool} not found "
                     "(Debian's valgrind package; scripts/setup_bench.sh installs it)")
    if a.passes < 1 or a.warmup < 1:
        sys.exit(f"pass_instructions: expected --passes and --warmup of at least 1, got {a.passes} and {a.warmup}")
    size, classes = MODELS.get(a.model, (32, 10))
    a.image_size = a.image_size or size
    a.classes = a.classes or classes

    builds = [("A", a.duet)] + ([("B", a.compare)] if a.compare else [])
    counts = {}
    with tempfile.TemporaryDirectory() as d:
        for tag, duet in builds:
            counts[tag] = per_pass(duet, a, d, tag)

    what = "training step" if a.training else "eval-mode pass"
    m = machine()
    print(f"{m['cpu']} (family {m['family']} model {m['model']}); {a.model} batch {a.batch}, one {what} on "
          f"1 thread: callgrind's count of {2 * a.passes} passes minus {a.passes}, per pass")
    for tag, duet in builds:
        print(f"  {tag} = {duet}: {sum(counts[tag].values()) / 1e6:.3f} million instructions")
    if a.compare:
        ta, tb = sum(counts["A"].values()), sum(counts["B"].values())
        print(f"  B - A = {(tb - ta) / 1e6:+.3f} million ({(tb - ta) / ta * 100:+.1f}%)")

    print("\nby where they run (thousands of instructions per pass)")
    ga = groups(counts["A"])
    gb = groups(counts["B"]) if a.compare else None
    for name in sorted(ga.keys() | (gb.keys() if gb else set()), key=lambda k: -ga.get(k, 0)):
        row = f"  {name:30s} {ga.get(name, 0) / 1e3:10.1f}"
        if gb is not None:
            row += f" {gb.get(name, 0) / 1e3:10.1f} {(gb.get(name, 0) - ga.get(name, 0)) / 1e3:+10.1f}"
        print(row)

    def ranked(tag):
        return sorted(counts[tag].items(), key=lambda kv: -kv[1])[: a.top]

    print(f"\nthe {a.top} functions with the most instructions of their own"
          + (" (in A; then B, B - A)" if a.compare else ""))
    for (function, obj, group), n in ranked("A"):
        row = f"  {n / 1e3:10.1f}K"
        if a.compare:
            nb = counts["B"].get((function, obj, group), 0)
            row += f" {nb / 1e3:10.1f}K {(nb - n) / 1e3:+9.1f}K"
        print(f"{row}  {short(function)} [{obj}]")

    if a.json:
        out = {"machine": m, "model": a.model, "batch": a.batch, "training": a.training,
               "passes": [a.passes, 2 * a.passes], "warmup": a.warmup, "threads": 1,
               "builds": {tag: {"duet": duet, "instructions_per_pass": sum(counts[tag].values()),
                                "groups": dict(groups(counts[tag])),
                                "top": [{"function": short(f, 200), "object": o, "instructions": n}
                                        for (f, o, _), n in ranked(tag)]}
                          for tag, duet in builds}}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
