#!/usr/bin/env python3
"""bench/onednn_versions.py end to end on two small layers, the oneDNN duet links on both sides
(--other-binary): it must finish, parse every pass of every layer in each dtype this CPU has, and its totals
and ratios must follow from its own per-layer times.

  python3 tests/onednn_versions_check.py SOURCE_DIR CONV_ALGOS_BINARY
"""
import json
import math
import os
import subprocess
import sys
import tempfile

src, binary = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "bench"))
from onednn_versions import default_dtypes  # noqa: E402
dtypes = default_dtypes().split(",")  # bf16 where oneDNN has bf16 convolutions, as the script picks
layers = [("16 8 32 3 1", 2), ("32 8 32 1 2", 1)]
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "ov.json")
    r = subprocess.run([sys.executable, os.path.join(src, "bench", "onednn_versions.py"), "--base", binary,
                        "--other-binary", binary, "--rounds", "1", "--shapes",
                        ";".join(f"{s}:{c}" for s, c in layers), "--json", out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout)
    assert r.returncode == 0, f"onednn_versions.py exited with {r.returncode}"
    d = json.load(open(out))
assert d["base_version"] == d["other_version"] and d["base_version"].count(".") == 2, d
rows = d["rows"]
assert {(x["dtype"], x["layer"], x["pass"]) for x in rows} == {
    (t, s, p) for t in dtypes for s, _ in layers for p in ("fwd", "bwd-data", "bwd-weights")}, rows
for x in rows:
    assert x["base_ms"] > 0 and x["other_ms"] > 0, x
    assert math.isclose(x["other_over_base"], x["other_ms"] / x["base_ms"], rel_tol=1e-9), x
for t in dtypes:
    tot = d["totals"][t]
    for side in ("base_ms", "other_ms"):
        want = sum(x["count"] * x[side] for x in rows if x["dtype"] == t)
        assert math.isclose(tot[side], want, rel_tol=1e-9), (t, side, tot, want)
    assert math.isclose(tot["other_over_base"], tot["other_ms"] / tot["base_ms"], rel_tol=1e-9), tot
assert all(x["base_variant"] and x["base_impl"] and x["other_variant"] and x["other_impl"] for x in rows), rows
print("onednn_versions: ok")
