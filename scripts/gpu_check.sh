#!/usr/bin/env bash
# The CUDA backend's validation on whatever NVIDIA GPU this machine has, in one command:
#
#   ./scripts/gpu_check.sh                       # build for this GPU, then every phase below
#   ./scripts/gpu_check.sh --build-dir build     # reuse a build that has the CUDA backend
#   ./scripts/gpu_check.sh --out DIR --train-size 512
#   ./scripts/gpu_check.sh --only tests,selftest --deadline 420   # some phases, none started after 7 min
#   duet-gpu-bundle/scripts/gpu_check.sh --bundle duet-gpu-bundle # no build: a bundle made elsewhere
#                                                                 # by scripts/gpu_bundle.sh
#
# Phases, in the order of what they prove, each bounded to 10 minutes, each writing its log into
# the output folder (default gpu-check/, git-ignored):
#   1. build    configure and build with the CUDA backend for the GPU present (its compute capability
#               from nvidia-smi; the default architecture list where there is no GPU). A machine that
#               lacks duet's required libraries (fmt, nlohmann-json, CLI11, libjpeg, libpng: a
#               cluster node, a PyTorch image) is told at once to use a bundle (--bundle); oneDNN,
#               GoogleTest and Google Benchmark are left out of the build where absent.
#   2. selftest duet selftest --device cuda: the op table on the GPU against the reference loops (the
#               cases the GPU refuses a dtype of are skipped and counted), then the same table timed
#               on the GPU (--mode perf: ms, GFLOP/s and GB/s per case), then the convolution cases
#               with DUET_CUDNN_BENCHMARK=1 (algorithms timed by cudnnFind)
#   3. tests    the whole test suite with DUET_REQUIRE_CUDA=1, so that a CUDA test that skips fails
#               (tests that skip by design on one GPU, such as the two-GPU copy, are counted apart)
#   4. step     resnet18_cifar: two training steps on the GPU and on the cpu backend from the same
#               seed, whose test losses must agree to 1%
#   5. models   one phase per benchmark model: one profiled epoch on synthetic data in f32, --amp bf16
#               and --amp fp16 on the GPU, the same run on the cpu backend (f32 and bf16), and
#               `duet compare` of the two reports (NVML telemetry is in each CUDA report); then
#               resnet18_cifar, resnet50_cifar and mobilenet_v2 steps with NHWC activations and
#               weights against NCHW (duet profile --memory-format nhwc|nchw)
#   6. nccl     with two GPUs and mpirun: resnet18_cifar on 2 ranks (NCCL) and on one process
#   7. pytorch  where python3 imports torch with CUDA: bench/train_throughput.py --device cuda, duet
#               against PyTorch on this GPU
#   8. cpu      the machine's CPU cores: the cpu backend against PyTorch at every core (nproc
#               threads), f32 and bf16, resnet18_cifar, about a minute
# and summary.md, one page: the GPU, each phase's result and time, the tables' last lines.
# --only takes a comma list of build, selftest, tests, step, models, layouts, nccl, pytorch, cpu.
# --deadline N: a phase that would start N seconds or more after the script did is skipped, and says
# so (a batch job's or a lent machine's time limit). scripts/gpu_device_run.sh is the command a lent
# GPU machine runs: it unpacks a bundle and runs this with a deadline.
#
# With --bundle there is no build: the binaries come from the bundle's bin/, the libraries it lacks
# from its lib/, and cuDNN, cuBLAS and the CUDA runtime from where this machine has them (the
# loader's path, the CUDA Toolkit, or the nvidia-* wheels of python3's PyTorch). Each test of the
# bundle's suites runs in a process of its own, as ctest runs them.
#
# Without an NVIDIA GPU it builds and runs the host-side CUDA tests, then stops with exit code 3 and
# says why (0: every phase passed; 1: a phase failed; 2: bad usage, no CUDA Toolkit, or a machine
# that cannot build duet).
#
# `gpu_check.sh --gtest-outcome LOG EXIT_CODE` prints how one GoogleTest test run in its own process
# ended (passed, skipped or failed), as the bundle's test phase counts it (tests/gtest_outcome_check.sh).
{ # parsed whole before it runs, so that editing the file during a run cannot change the run
set -uo pipefail

# gtest_outcome <log> <exit code>: passed, skipped or failed, for a process that ran one test. Exit 0
# counts only with GoogleTest's line for exactly one test, passed ("[  PASSED  ] 1 test.") or skipped
# ("[  SKIPPED ] 1 test, listed below:"): a filter that matched nothing exits 0 too.
gtest_outcome() {
  if [ "$2" -ne 0 ]; then echo failed
  elif grep -qE '^\[  PASSED  \] 1 test\.' "$1"; then echo passed
  elif grep -qE '^\[  SKIPPED \] 1 test[,.]' "$1"; then echo skipped
  else echo failed
  fi
}
if [ "${1:-}" = --gtest-outcome ]; then
  [ $# -eq 3 ] && [ -r "$2" ] && [[ "$3" =~ ^[0-9]+$ ]] || { echo "usage: gpu_check.sh --gtest-outcome LOG EXIT_CODE" >&2; exit 2; }
  gtest_outcome "$2" "$3"
  exit 0
fi

usage() { sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; }
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/gpu-check"; build=""; bundle=""; train_size=1024; only=""; deadline=""
all_phases=",build,selftest,tests,step,models,layouts,nccl,pytorch,cpu,"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift ;;
    --build-dir) build="$2"; shift ;;
    --bundle) bundle="$2"; shift ;;
    --train-size) train_size="$2"; shift ;;
    --only) only=",$2,"; shift ;;
    --deadline) deadline="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown option '$1' (expected --out DIR, --build-dir DIR, --bundle DIR, --train-size N," \
            "--only PHASES, --deadline SECONDS)" >&2; exit 2 ;;
  esac
  shift
done
for p in ${only//,/ }; do
  [[ "$all_phases" == *",$p,"* ]] || { echo "gpu_check: unknown phase '$p' in --only (expected${all_phases//,/ })" >&2; exit 2; }
done
[[ -z "$deadline" || "$deadline" =~ ^[0-9]+$ ]] || { echo "gpu_check: --deadline takes seconds, got '$deadline'" >&2; exit 2; }
[ -n "$bundle" ] && [ -n "$build" ] && { echo "gpu_check: --bundle and --build-dir exclude each other" >&2; exit 2; }
wanted() { [ -z "$only" ] || [[ "$only" == *",$1,"* ]]; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.md"
phase_rows=()
failed=0

# phase <name> <log> <command...>: run, record the result and the time. Commands get their time
# limits where they are written (timeout 600 for a whole phase, less for each step of a loop).
phase() {
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS rc=0
  if [ -n "$deadline" ] && [ "$SECONDS" -ge "$deadline" ]; then
    phase_rows+=("| $name | skipped: past --deadline $deadline s | | |")
    echo "== $name: skipped, past the deadline ($SECONDS s of $deadline)"
    return 0
  fi
  echo "== $name (log: $log)"
  running="$name"; running_log="$log"; running_t0=$SECONDS
  "$@" > "$log" 2>&1 || rc=$?
  running=""
  local verdict="passed"
  if [ $rc -eq 124 ]; then verdict="TIMED OUT (10 min)"; elif [ $rc -ne 0 ]; then verdict="FAILED (exit $rc)"; fi
  [ $rc -eq 0 ] || failed=1
  phase_rows+=("| $name | $verdict | $((SECONDS - t0)) s | \`$(basename "$log")\` |")
  echo "   $verdict in $((SECONDS - t0)) s"
  return $rc
}

# Stopped from outside (a lent machine's time running out: gpu_device_run.sh's timeout): the phase
# under way is recorded as cut short and the summary written, so the run's result is not lost.
running=""; running_log=""; running_t0=0
on_stop() {
  trap - TERM INT
  if [ -n "$running" ]; then
    phase_rows+=("| $running | STOPPED from outside after $((SECONDS - running_t0)) s | | \`$(basename "$running_log")\` |")
  fi
  phase_rows+=("| (the rest) | not run: the check was stopped at $SECONDS s | | |")
  failed=1
  write_summary
  exit 124
}
trap on_stop TERM INT

write_summary() {
  {
    echo "# duet GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    if [ -n "$bundle" ]; then
      echo "- bundle: $bundle, $(sed -n 's/^commit: /commit /p' "$bundle/MANIFEST"), $(sed -n 's/^built: /built /p' "$bundle/MANIFEST")"
    else
      echo "- commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    fi
    echo "- GPU: ${gpu_line:-none}"
    echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) logical CPUs"
    echo
    echo "| phase | result | time | log |"
    echo "| --- | --- | ---: | --- |"
    printf '%s\n' "${phase_rows[@]}"
    for f in "$out"/bundle.log "$out"/selftest.txt "$out"/pytorch.txt "$out"/cpu_threads.txt; do
      [ -s "$f" ] || continue
      echo; echo "\`$(basename "$f")\`, last lines:"; echo; echo '```'; tail -4 "$f"; echo '```'
    done
    if ls "$out"/compare_*.txt >/dev/null 2>&1; then
      echo; echo "CPU against GPU, per model (\`compare_*.txt\`, first lines):"
      for f in "$out"/compare_*.txt; do echo; echo "$(basename "$f"):"; echo '```'; head -8 "$f"; echo '```'; done
    fi
  } > "$summary"
  echo "summary: $summary"
}

# use_bundle: the bundle's binaries made loadable here. The bundle's lib/ first; then, for each NVIDIA
# library the bundle leaves to this machine and the loader does not find by itself, the CUDA Toolkit's
# folder or the nvidia-* wheel of python3's PyTorch that has it; the bundle's own CUDA runtime last.
use_bundle() {
  [ -f "$bundle/MANIFEST" ] && [ -x "$bundle/bin/duet" ] || {
    echo "gpu_check: $bundle is not a bundle made by scripts/gpu_bundle.sh (no MANIFEST or bin/duet)" >&2; return 1; }
  local cache wheels dirs="" name d missing
  cache=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | awk '{print $1}' || true)
  # findable <library>: in the loader's cache or in a folder of LD_LIBRARY_PATH
  findable() { grep -qx "$1" <<< "$cache" || (IFS=:; for d in ${LD_LIBRARY_PATH:-}; do [ -e "$d/$1" ] && exit 0; done; exit 1); }
  wheels=$(python3 -c 'import nvidia, os; [print(os.path.join(p, d, "lib")) for p in nvidia.__path__ for d in sorted(os.listdir(p))]' \
           2>/dev/null || true)
  # libnvrtc: cuDNN 9 compiles some of its engines at run time and loads NVRTC for it (dlopen, so ldd
  # cannot see it missing); from pip wheels it sits in another wheel's folder than cuDNN.
  # libnccl: a bundle packed from a build with MPI and NCCL (--build-dir) needs it; pip's
  # nvidia-nccl-cu13 has it.
  for name in libcudnn.so.9 libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnvrtc.so.13 libnccl.so.2; do
    findable "$name" && continue
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib $wheels; do
      if [ -e "$d/$name" ]; then [[ "$dirs:" == *":$d:"* ]] || dirs="$dirs:$d"; break; fi
    done
  done
  export LD_LIBRARY_PATH="$bundle/lib$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$bundle/lib/fallback"
  # ldd's "libX => not found" and "...: version `GLIBC_2.34' not found", once each over all binaries
  missing=$(ldd "$bundle"/bin/* 2>&1 | sed -n -e 's/^[[:space:]]*\([^ ]*\) => not found$/\1 => not found/p' \
            -e "s/.*\/\([^/:]*\): version \`\([^']*\)' not found.*/\2 (of \1) => not found/p" | sort -uV)
  # cuBLAS is loaded at the first matrix product (dlopen), so ldd cannot see it missing
  findable libcublas.so.13 ||
    missing="$missing${missing:+$'\n'}libcublas.so.13 => not found (loaded at the first GPU matrix product)"
  if [ -n "$missing" ]; then
    echo "gpu_check: the bundle's binaries cannot run on this machine:" >&2
    echo "$missing" | sed 's/^[[:space:]]*/  /' >&2
    echo "  cuDNN 9 and cuBLAS 13 come with the CUDA Toolkit 13 or as pip's nvidia-cudnn-cu13 and nvidia-cublas;" \
         "a missing GLIBC or GLIBCXX version means this system is older than the one that made the bundle" >&2
    return 1
  fi
  if grep -q "^cpu_isa: x86-64-v3" "$bundle/MANIFEST"; then
    local flag
    for flag in avx2 fma bmi2 f16c movbe; do
      grep -qw "$flag" /proc/cpuinfo || {
        echo "gpu_check: the bundle's CPU code needs x86-64-v3 (AVX2, FMA); this CPU lacks $flag" >&2; return 1; }
    done
  elif grep -q "^cpu_isa: native" "$bundle/MANIFEST"; then
    echo "gpu_check: the bundle was compiled for the CPU that built it (-march=native): an 'illegal instruction'" \
         "here means this CPU lacks one of its instructions"
  fi
  echo "gpu_check: bundle $(sed -n 's/^commit: //p' "$bundle/MANIFEST"), LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

# run_suites [--require-cuda] <suite...>: each test of the bundle's gtest binaries in a process of its own,
# as ctest runs them (some tests check what a fresh process has loaded), nproc at a time, each test's
# output in tests/; the whole run limited to 10 minutes. --require-cuda: a CUDA test that skips fails.
run_suites() (
  [ "$1" = --require-cuda ] && { export DUET_REQUIRE_CUDA=1; shift; }
  local dir="$out/tests" s rc=0
  rm -rf "$dir"; mkdir -p "$dir"
  for s in "$@"; do "$bundle/bin/$s" --gtest_list_tests | awk -v b="$s" '/^[^ ]/ {c = $1} /^  / {print b, c $1}'; done \
    > "$dir/list.txt" || exit 1
  # each line of results.txt: outcome (gtest_outcome), exit code, suite, test
  timeout 600 xargs -P "$(nproc)" -L 1 sh -c 'f=$(printf %s "$4.$5" | tr / _)
    timeout 300 "$2/bin/$4" --gtest_filter="$5" > "$3/$f.log" 2>&1; rc=$?
    echo "$("$1" --gtest-outcome "$3/$f.log" $rc) $rc $4 $5"' sh "$self" "$bundle" "$dir" \
    < "$dir/list.txt" > "$dir/results.txt" || rc=$?
  local total ran passed skipped failed
  total=$(wc -l < "$dir/list.txt"); ran=$(wc -l < "$dir/results.txt")
  passed=$(grep -c '^passed ' "$dir/results.txt"); skipped=$(grep -c '^skipped ' "$dir/results.txt")
  failed=$(grep -c '^failed ' "$dir/results.txt")
  echo "$total tests of $# suites, each in its own process: $passed passed, $skipped skipped, $failed failed," \
       "$((total - ran)) not run"
  grep '^skipped ' "$dir/results.txt" | while read -r _ _ s name; do
    echo "skipped: $s $name: $(grep -m1 -A1 ': Skipped$' "$dir/$(printf %s "$s.$name" | tr / _).log" | tail -1)"
  done
  grep '^failed ' "$dir/results.txt" | while read -r _ code s name; do
    echo; echo "FAILED (exit $code): $s $name"; tail -20 "$dir/$(printf %s "$s.$name" | tr / _).log"
  done
  [ $rc -eq 124 ] && exit 124
  [ "$failed" -eq 0 ] && [ "$ran" -eq "$total" ]
)

gpu_line=""
archs=""
if command -v nvidia-smi >/dev/null && gpu_line=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -1) && [ -n "$gpu_line" ]; then
  cap=$(echo "$gpu_line" | cut -d, -f2 | tr -d ' .')
  archs="${cap}-real"
  echo "gpu_check: $gpu_line"
else
  gpu_line=""
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi found none): running the host-side CUDA tests only"
fi

if [ -n "$bundle" ]; then
  bundle=$(cd "$bundle" 2>/dev/null && pwd) || { echo "gpu_check: --bundle: no folder ${bundle}" >&2; exit 2; }
  # its messages kept in the output folder, so that a bundle that cannot run here says why in the summary
  use_bundle > "$out/bundle.log" 2>&1 || {
    cat "$out/bundle.log" >&2
    phase_rows+=("| load the bundle | FAILED: its binaries cannot run here (bundle.log below) | | \`bundle.log\` |")
    write_summary
    exit 2
  }
  cat "$out/bundle.log"
  duet="$bundle/bin/duet"
else
  nvcc_path=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
  if [ -z "$nvcc_path" ]; then
    echo "gpu_check: no nvcc (CUDA Toolkit) found on PATH or in /usr/local/cuda/bin: install the CUDA Toolkit 13 and" \
         "cuDNN 9, or run a bundle made elsewhere by scripts/gpu_bundle.sh (--bundle DIR)" >&2
    exit 2
  fi
  # 1. build
  if [ -z "$build" ]; then
    # What this machine can build, said before anything runs: the libraries duet cannot do without,
    # and those the GPU check can (oneDNN: without it the step and models phases' cpu halves run on
    # the reference loops, within their time limits; GoogleTest: the tests phase; Google Benchmark,
    # never needed here).
    has_header() { echo "#include <$1>" | c++ -x c++ -E - > /dev/null 2>&1; }
    missing=""
    for h in fmt/format.h nlohmann/json.hpp CLI/CLI.hpp jpeglib.h png.h; do has_header "$h" || missing="$missing $h"; done
    if [ -n "$missing" ]; then
      echo "gpu_check: this machine cannot build duet: it lacks the headers$missing (Debian: libfmt-dev" \
           "nlohmann-json3-dev libcli11-dev libjpeg-dev libpng-dev, which ./scripts/setup.sh installs). On a GPU" \
           "machine without them, run a bundle built elsewhere: ./scripts/gpu_bundle.sh there, then" \
           "duet-gpu-bundle/scripts/gpu_check.sh --bundle duet-gpu-bundle here (scripts/gpu_device_run.sh does" \
           "both halves for a lent GPU machine; docs/cuda_backend.md has the recipe)" >&2
      exit 2
    fi
    build="$repo/build-gpu"
    cfg=(-DDUET_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc_path" -DDUET_BUILD_BENCH=OFF)
    has_header dnnl.hpp || { cfg+=(-DDUET_ONEDNN=OFF); echo "gpu_check: no oneDNN here: built without the cpu backend"; }
    has_header gtest/gtest.h || { cfg+=(-DDUET_BUILD_TESTS=OFF); echo "gpu_check: no GoogleTest here: built without the tests"; }
    [ -n "$archs" ] && cfg+=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
    build_it() { cmake -S "$repo" -B "$build" -G Ninja "${cfg[@]}" && timeout 600 cmake --build "$build" -j"$(nproc)"; }
    if wanted build; then phase build "$out/build.log" build_it || { write_summary; exit 1; }; fi
  fi
  duet="$build/duet"
  [ -x "$duet" ] || { echo "gpu_check: $duet does not exist: build first or drop --build-dir" >&2; exit 2; }
  if ! grep -q "duet_cuda" "$build/build.ninja" 2>/dev/null; then
    echo "gpu_check: $build was configured without the CUDA backend (reconfigure with -DDUET_CUDA=ON)" >&2
    exit 2
  fi
fi

if [ -z "$gpu_line" ]; then
  if [ -n "$bundle" ]; then
    phase "host-side CUDA tests" "$out/tests_host.log" run_suites test_cuda_host test_cuda_allocator
  else
    phase "host-side CUDA tests" "$out/tests_host.log" timeout 600 ctest --test-dir "$build" --output-on-failure \
      -R "test_cuda_(host|allocator)\\."
  fi
  write_summary
  echo "gpu_check: stopped before the phases that need a GPU (none here); run this on a machine with an NVIDIA GPU"
  [ $failed -eq 0 ] && exit 3 || exit 1
fi

# 2. selftest: the op table on the GPU first, since it names the op that is wrong
if wanted selftest; then
  phase selftest "$out/selftest.txt" timeout 600 "$duet" selftest --device cuda
  phase "selftest --mode perf" "$out/selftest_perf.txt" timeout 600 "$duet" selftest --device cuda --mode perf
  # The convolutions again with algorithms chosen by timing (cudnnFind) instead of the heuristics.
  phase "selftest conv, DUET_CUDNN_BENCHMARK=1" "$out/selftest_benchmark.txt" env DUET_CUDNN_BENCHMARK=1 timeout 600 \
    "$duet" selftest --device cuda --filter conv
fi

# 3. tests: every suite (a bundle's: those it packed, the ones with GPU tests), a CUDA skip counts as a failure
if wanted tests; then
  if [ -n "$bundle" ]; then
    # the suites gpu_bundle.sh packed, whichever they are
    phase "tests (DUET_REQUIRE_CUDA=1)" "$out/tests.log" run_suites --require-cuda \
      $(cd "$bundle/bin" && ls test_*)
  elif [ -f "$build/CTestTestfile.cmake" ]; then
    phase "tests (DUET_REQUIRE_CUDA=1)" "$out/tests.log" env DUET_REQUIRE_CUDA=1 timeout 600 \
      ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
  else
    phase_rows+=("| tests (DUET_REQUIRE_CUDA=1) | skipped: built without GoogleTest | | |")
  fi
fi

# 4. step: the same two training steps on the GPU and on the cpu backend, from the same seed and
# without augmentation; their test losses (printed to 4 decimals) must agree to 1%.
step_run() {
  local dev loss rc=0
  local -a losses=()
  for dev in cuda cpu; do
    echo "-- $dev"
    timeout 120 "$duet" --device "$dev" --seed 1 train --model resnet18_cifar --dataset synthetic --image-size 32 \
      --classes 10 --train-size 128 --test-size 128 --batch 64 --epochs 1 --no-augment --log-every 1 \
      > "$out/step_$dev.txt" 2>&1 || { echo "   FAILED: $out/step_$dev.txt"; tail -5 "$out/step_$dev.txt"; return 1; }
    loss=$(sed -n 's/.*test loss \([0-9.]*\).*/\1/p' "$out/step_$dev.txt" | tail -1)
    echo "   test loss $loss"
    [ -n "$loss" ] || { echo "   no test loss in $out/step_$dev.txt"; return 1; }
    losses+=("$loss")
  done
  awk -v g="${losses[0]}" -v c="${losses[1]}" 'BEGIN {
    d = (g > c ? g - c : c - g) / (c > 0 ? c : 1)
    printf "GPU %s against cpu %s: relative difference %.2g (at most 0.01)\n", g, c, d
    exit !(d <= 0.01) }' || rc=1
  return $rc
}
wanted step && phase "two training steps: GPU against the cpu backend" "$out/step.log" step_run

# 5. models: one profiled epoch each, on the GPU (f32, bf16, fp16) and on the cpu backend (f32, bf16),
# one phase per model; each training run is limited to 2 minutes (the five fit the 10)
run_model() {  # run_model <model> <image size> <classes>
  local m="$1" size="$2" classes="$3" amp dev rc=0
  for amp in off bf16 fp16; do
    for dev in cuda cpu; do
      [ "$dev" = cpu ] && [ "$amp" = fp16 ] && continue  # fp16 autocast is the GPU's
      local tag="${m}_${size}_${amp}_${dev}"
      echo "-- $tag"
      timeout 120 "$duet" --device "$dev" train --model "$m" --dataset synthetic --image-size "$size" --classes "$classes" \
        --train-size "$train_size" --test-size 256 --epochs 1 --batch 64 --amp "$amp" --log-every 0 \
        --profile "$out/$tag.json" --trace "$out/$tag.trace.json" > "$out/$tag.txt" 2>&1 || { echo "   FAILED: $out/$tag.txt"; rc=1; }
      tail -1 "$out/$tag.txt"
    done
    if [ -s "$out/${m}_${size}_${amp}_cpu.json" ] && [ -s "$out/${m}_${size}_${amp}_cuda.json" ]; then
      timeout 60 "$duet" compare "$out/${m}_${size}_${amp}_cpu.json" "$out/${m}_${size}_${amp}_cuda.json" \
        > "$out/compare_${m}_${size}_${amp}.txt" 2>&1 || rc=1
    fi
  done
  return $rc
}
if wanted models; then
  for spec in "resnet18_cifar 32 10" "resnet50_cifar 32 10" "densenet121 32 10" "mobilenet_v2 32 10" "vit_tiny_p4 32 10" \
              "resnet18 128 2"; do
    read -r m size classes <<< "$spec"
    phase "model $m at $size px: f32/bf16/fp16 on the GPU, f32/bf16 on the cpu backend" "$out/model_${m}_${size}.log" \
      run_model "$m" "$size" "$classes"
  done
fi

# 5b. channels-last on the GPU: activations and weights NHWC (--memory-format nhwc converts the
# model, so cuDNN gets NHWC filters with no copy) against the NCHW default, the figures that
# should decide --memory-format auto on a GPU
nhwc_run() {
  local m f rc=0
  for m in resnet18_cifar resnet50_cifar mobilenet_v2; do
    for f in nchw nhwc; do
      echo "-- $m $f"
      timeout 100 "$duet" --device cuda profile --model "$m" --batch 64 --steps 20 --warmup 5 --mode throughput \
        --memory-format "$f" > "$out/layout_${m}_${f}.txt" 2>&1 || { echo "   FAILED: $out/layout_${m}_${f}.txt"; rc=1; }
      tail -1 "$out/layout_${m}_${f}.txt"
    done
  done
  return $rc
}
wanted layouts &&
  phase "NHWC against NCHW on the GPU (resnet18_cifar, resnet50_cifar, mobilenet_v2)" "$out/layouts.log" nhwc_run

# 6. data-parallel on two GPUs through NCCL, where there are two and mpirun: 2 ranks with batch 32
# against one process with batch 64 (the parameters should agree to f32 rounding; see the log)
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if ! wanted nccl; then
  :
elif [ -n "$bundle" ]; then
  phase_rows+=("| data-parallel on 2 GPUs (NCCL) | skipped: a bundle is one process (built without MPI) | | |")
elif [ "$gpus" -ge 2 ] && command -v mpirun >/dev/null; then
  nccl_run() {
    local common=(train --model resnet18_cifar --dataset synthetic --image-size 32 --train-size 1024 --test-size 256
                  --epochs 1 --log-every 0)
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun --oversubscribe -np 2 "$duet" \
      --device cuda "${common[@]}" --batch 32 --checkpoint "$out/nccl_2ranks.safetensors" --profile "$out/nccl.json" &&
    timeout 200 "$duet" --device cuda "${common[@]}" --batch 64 --checkpoint "$out/nccl_1process.safetensors"
  }
  phase "data-parallel on 2 GPUs (NCCL)" "$out/nccl.log" nccl_run
else
  phase_rows+=("| data-parallel on 2 GPUs (NCCL) | skipped: $gpus GPU(s)$(command -v mpirun >/dev/null || echo ', no mpirun') | | |")
fi

# 7. PyTorch on the same GPU, where it is importable with CUDA
if ! wanted pytorch; then
  :
elif python3 -c "import torch, torchvision, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  phase "duet against PyTorch on this GPU" "$out/pytorch.txt" timeout 600 python3 "$repo/bench/train_throughput.py" --duet "$duet" \
    --device cuda --steps 20 --warmup 5 --json "$out/pytorch.json"
else
  phase_rows+=("| duet against PyTorch on this GPU | skipped: python3 has no torch with CUDA | | |")
fi

# 8. the GPU machine's many CPU cores: duet's cpu backend against PyTorch at every core, f32 and
# bf16, on resnet18_cifar (a minute), so that thread scaling is measured where there are cores
if ! wanted cpu; then
  :
elif python3 -c "import torch, torchvision" 2>/dev/null; then
  phase "cpu backend against PyTorch at $(nproc) threads" "$out/cpu_threads.txt" timeout 240 python3 \
    "$repo/bench/train_throughput.py" --duet "$duet" --device cpu --threads "$(nproc)" --models resnet18_cifar \
    --rounds 1 --steps 5 --warmup 2 --bf16 --json "$out/cpu_threads.json"
else
  phase_rows+=("| cpu backend against PyTorch at $(nproc) threads | skipped: python3 has no torch | | |")
fi

write_summary
exit $failed
}
