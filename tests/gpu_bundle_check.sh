#!/usr/bin/env bash
# ctest gpu_bundle.check: scripts/gpu_bundle.sh packs this build, and from another folder the bundle's
# own gpu_check.sh loads its binaries and passes their tests: without a GPU the host-side CUDA tests
# (exit 3, "stopped before the phases that need a GPU"), on a GPU machine the GPU suites.
#   tests/gpu_bundle_check.sh <repository> <build folder>
set -euo pipefail
repo=$1 build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/duet-bundle-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$repo/scripts/gpu_bundle.sh" --build-dir "$build" --dir "$tmp/bundle"
cat "$tmp/bundle/MANIFEST"
for f in bin/duet bin/test_cuda_device bin/test_cuda_host scripts/gpu_check.sh bench/train_throughput.py; do
  [ -e "$tmp/bundle/$f" ] || { echo "the bundle lacks $f"; exit 1; }
done
ls "$tmp"/bundle/lib/libdnnl.so.* > /dev/null || { echo "the bundle lacks oneDNN"; exit 1; }
rc=0
"$tmp/bundle/scripts/gpu_check.sh" --bundle "$tmp/bundle" --out "$tmp/check" --only tests || rc=$?
cat "$tmp/check/summary.md"
case $rc in
  3) grep -q ", 0 failed, 0 not run" "$tmp/check/tests_host.log" && grep -q "^[1-9][0-9]* tests" "$tmp/check/tests_host.log" ;;
  0) grep -q ", 0 failed, 0 not run" "$tmp/check/tests.log" ;;
  *) echo "gpu_check.sh --bundle exited with $rc"; cat "$tmp/check/tests"*.log 2> /dev/null; exit 1 ;;
esac
