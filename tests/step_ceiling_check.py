#!/usr/bin/env python3
"""bench/step_ceiling.py end to end on a tiny model: it must finish, and its JSON must hold the
rounds asked for and fractions that follow from its own GFLOP, step time and ceiling.

  python3 tests/step_ceiling_check.py SOURCE_DIR DUET_BINARY
"""
import json
import math
import os
import subprocess
import sys
import tempfile

src, duet = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "bench"))
from train_throughput import machine  # noqa: E402
# fp32, and bf16 against the probe's bf16 ceiling where oneDNN 2.6 has a bf16 GEMM: AMX,
# avx512_bf16 or its conversion path on plain AVX-512; below AVX-512 (AMD Zen 3) it has none, and
# step_ceiling.py says so.
for amp in ("off", "bf16") if "avx512f" in machine()["isa"] else ("off",):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sc.json")
        r = subprocess.run([sys.executable, os.path.join(src, "bench", "step_ceiling.py"), "--duet", duet, "--model",
                            "small_cnn", "--batch", "4", "--rounds", "2", "--steps", "2", "--warmup", "1",
                            "--probe-size", "128", "--amp", amp, "--json", out], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        print(r.stdout)
        assert r.returncode == 0, f"step_ceiling.py --amp {amp} exited with {r.returncode}"
        d = json.load(open(out))
    assert d["model"] == "small_cnn" and d["amp"] == amp and len(d["rounds"]) == 2, d
    assert d["step_gflop_direct"] > 0, d
    for row in d["rounds"]:
        assert row["probe_gflops"] > 0 and row["step_ms"] > 0, row
        want = d["step_gflop_direct"] / (row["step_ms"] / 1e3) / row["probe_gflops"]
        assert math.isclose(row["fraction"], want, rel_tol=1e-9), (row, want)
        assert math.isclose(row["fraction_issue_count"], want / 2, rel_tol=1e-9), row
    assert "of the ceiling in issue 18's count" in r.stdout and "in the profile's" in r.stdout
    assert f"amp {amp}," in r.stdout
print("step_ceiling: ok")
