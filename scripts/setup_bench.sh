#!/usr/bin/env bash
# Makes the benchmarks' Python environment: a virtual environment in .venv-bench/ at the repository
# root (git-ignored) with the pinned packages of bench/requirements.txt (PyTorch, torchvision, numpy,
# matplotlib, Pillow) from PyPI. Every bench script and README benchmark command uses it:
#
#   ./scripts/setup_bench.sh
#   .venv-bench/bin/python bench/train_throughput.py --duet build/duet --threads 2
#
# Safe to run again: an existing environment is brought to the pinned versions. Needs Debian's
# python3 and python3-venv, and valgrind for bench/pass_instructions.py's instruction counts
# (installed with apt-get when missing, which needs root or sudo).
# DUET_BENCH_VENV=<folder> puts the environment elsewhere.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${DUET_BENCH_VENV:-$repo/.venv-bench}
python=/usr/bin/python3  # Debian's interpreter, not whatever python3 comes first on PATH

source "$repo/scripts/apt_install_missing.sh"
apt_install_missing setup_bench python3 python3-venv valgrind

if [ ! -x "$venv/bin/python" ]; then
  echo "setup_bench: creating $venv"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$repo/bench/requirements.txt"
"$venv/bin/python" - <<'PY'
import matplotlib, numpy, PIL, torch, torchvision
print(f"setup_bench: torch {torch.__version__}, torchvision {torchvision.__version__}, numpy {numpy.__version__}, "
      f"matplotlib {matplotlib.__version__}, pillow {PIL.__version__}")
PY
echo "setup_bench: ready; run the benchmarks with $venv/bin/python bench/<script>.py"
