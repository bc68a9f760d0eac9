#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -DDUET_FUZZ=ON, in build-fuzz/) and runs each for SECONDS
# (default 20), starting from the seed corpus in fuzz/corpus/<target>; new inputs go to
# build-fuzz/corpus/<target>, so the repository's seeds stay small. A crash, a sanitizer report,
# a leak, a timeout or an exception other than duet::Error fails the run and leaves the input in
# build-fuzz/findings/. Prints each target's executions and time.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      targets: safetensors checkpoint cifar image report
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(safetensors checkpoint cifar image report); fi
command -v clang++ >/dev/null || { echo "fuzz: clang++ is missing (scripts/setup.sh installs it)"; exit 1; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DDUET_FUZZ=ON -DDUET_ONEDNN=OFF -DDUET_CUDA=OFF \
  -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF -DDUET_NATIVE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j2 --target "${targets[@]/#/fuzz_}"
mkdir -p build-fuzz/findings
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  log="build-fuzz/fuzz_$t.log"
  # -rss_limit_mb: images are capped at 2^22 pixels by the target, so more is a finding.
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "build-fuzz/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/findings/$t-" "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    echo "fuzz $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') executions in ${seconds} s, no finding"
  else
    status=1
    echo "fuzz $t: FINDING (see $log and build-fuzz/findings/)"
    grep -m5 -E 'ERROR|runtime error|terminate|deadly' "$log" || tail -20 "$log"
  fi
done
exit $status
