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
# fp32, then bf16 against the probe's bf16 ceiling where the machine record of the fp32 run says the
# cpu backend computes bf16 on oneDNN (AVX-512 and up); below AVX-512 (AMD Zen 3) it has no bf16
# GEMM, and step_ceiling.py says so.
amps = ["off"]
for amp in amps:
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
    # a build with oneDNN always says where bf16 runs
    assert d["machine"].get("onednn") is None or d["machine"].get("cpu_bf16") in ("onednn", "reference_loops"), d["machine"]
    if amp == "off" and d["machine"].get("cpu_bf16") == "onednn":
        amps.append("bf16")  # the loop takes it next
print(f"step_ceiling: ok (amp {', '.join(amps)}; cpu_bf16 {d['machine'].get('cpu_bf16')})")
