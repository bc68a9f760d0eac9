#!/usr/bin/env python3
"""bench/pass_instructions.py end to end on a small pass (mobilenet_v2, batch 1): it must finish,
its groups must add up to its total, the few-row kernel that runs MobileNetV2's batch-1 products
must be among the functions it lists, one binary counted against itself must differ by almost
nothing (the counts are what the tool is for), and a bad --passes must be refused by name. Exits
77 (skipped) where valgrind is missing (scripts/setup_bench.sh installs it) or cannot decode the
binary (valgrind 3.19 has no AVX-512, which a -march=native build uses on an AVX-512 CPU).

  python3 tests/pass_instructions_check.py SOURCE_DIR DUET_BINARY
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

src, duet = sys.argv[1], sys.argv[2]
if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
    print("pass_instructions: valgrind is not installed here (scripts/setup_bench.sh installs it): skipped")
    sys.exit(77)
script = os.path.join(src, "bench", "pass_instructions.py")
sys.path.insert(0, os.path.join(src, "bench"))
from pass_instructions import UNDECODABLE  # noqa: E402  the tool's exit status when valgrind cannot decode
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "counts.json")
    r = subprocess.run([sys.executable, script, "--duet", duet, "--compare", duet, "--model", "mobilenet_v2",
                        "--batch", "1", "--passes", "2", "--warmup", "1", "--top", "40", "--json", out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout)
    if r.returncode == UNDECODABLE and "cannot decode an instruction" in r.stdout:
        print("pass_instructions: valgrind cannot run this build here: skipped")
        sys.exit(77)
    assert r.returncode == 0, f"pass_instructions.py exited with {r.returncode}"
    d = json.load(open(out))
assert d["model"] == "mobilenet_v2" and d["batch"] == 1 and d["passes"] == [2, 4] and d["threads"] == 1, d
a, b = d["builds"]["A"], d["builds"]["B"]
# A MobileNetV2 pass at 32 px runs about 300 million multiply-adds' worth of kernels and glue: a few
# million instructions, not thousands and not billions.
assert 1e6 < a["instructions_per_pass"] < 1e8, a["instructions_per_pass"]
assert math.isclose(sum(a["groups"].values()), a["instructions_per_pass"], rel_tol=1e-9), a["groups"]
assert a["groups"].get("duet: cpu backend", 0) > 0 and a["groups"].get("duet: the rest", 0) > 0, a["groups"]
assert any("skinny_gemm" in f["function"] or "dot_part" in f["function"] or "dot_block" in f["function"]
           for f in a["top"]), [f["function"] for f in a["top"]]
assert abs(b["instructions_per_pass"] - a["instructions_per_pass"]) < 0.02 * a["instructions_per_pass"], (a, b)
bad = subprocess.run([sys.executable, script, "--duet", duet, "--passes", "0"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
assert bad.returncode != 0 and "expected --passes and --warmup of at least 1" in bad.stdout, bad.stdout
print("pass_instructions: ok")
