#!/usr/bin/env bash
# Makes the tests' Python environment: .venv-test/ at the repository root (git-ignored) with the
# pinned packages of tests/requirements.txt from PyPI (TensorBoard's reader, ONNX and ONNX Runtime).
# The tests that read duet's TensorBoard logs or run its ONNX exports find it there (DUET_TEST_VENV
# puts it elsewhere) and report themselves skipped without it, unless DUET_REQUIRE_TEST_ENV=1 (CI)
# makes its absence a failure. Safe to run again. Needs Debian's python3 and python3-venv (installed
# with apt-get when missing, which needs root or sudo).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${DUET_TEST_VENV:-$repo/.venv-test}
python=/usr/bin/python3  # Debian's interpreter, not whatever python3 comes first on PATH

source "$repo/scripts/apt_install_missing.sh"
apt_install_missing setup_test_env python3 python3-venv

[ -x "$venv/bin/python" ] || { echo "setup_test_env: creating $venv"; "$python" -m venv "$venv"; }
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$repo/tests/requirements.txt"
"$venv/bin/python" -c 'import onnx, onnxruntime, tensorboard; print(f"setup_test_env: onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, tensorboard {tensorboard.__version__}")'
