#!/usr/bin/env python3
"""bench/compare_builds.py end to end, one binary on both sides of a small row: it must finish, its
JSON must hold every round of both sides and the ratio that follows from their medians, and a row
it cannot run must be refused by name.

  python3 tests/compare_builds_check.py SOURCE_DIR DUET_BINARY
"""
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

src, duet = sys.argv[1], sys.argv[2]
script = os.path.join(src, "bench", "compare_builds.py")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "ab.json")
    r = subprocess.run([sys.executable, script, "--a", duet, "--b", duet, "--a-label", "A", "--b-label", "B",
                        "--inference", "--rows", "resnet18_cifar:1", "--rounds", "2", "--steps", "2", "--warmup", "1",
                        "--json", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout)
    assert r.returncode == 0, f"compare_builds.py exited with {r.returncode}"
    d = json.load(open(out))
assert d["a"] == "A" and d["b"] == "B" and d["inference"] and d["rounds"] == 2, d
(row,) = d["rows"]
assert row["model"] == "resnet18_cifar" and row["batch"] == 1, row
assert len(row["a_s"]) == 2 and len(row["b_s"]) == 2 and min(row["a_s"] + row["b_s"]) > 0, row
assert math.isclose(row["a_median_s"], statistics.median(row["a_s"])), row
assert math.isclose(row["a_over_b"], row["a_median_s"] / row["b_median_s"]), row
bad = subprocess.run([sys.executable, script, "--a", duet, "--b", duet, "--rows", "resnet18_cifar"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
assert bad.returncode != 0 and "bad row 'resnet18_cifar'" in bad.stdout, bad.stdout
print("compare_builds: ok")
