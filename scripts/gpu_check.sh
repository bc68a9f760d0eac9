#!/usr/bin/env bash
# The CUDA backend's validation on whatever NVIDIA GPU this machine has, in one command:
#
#   ./scripts/gpu_check.sh                       # build for this GPU, then every phase below
#   ./scripts/gpu_check.sh --build-dir build     # reuse a build that has the CUDA backend
#   ./scripts/gpu_check.sh --out DIR --train-size 512
#
# Phases, each bounded to 10 minutes, each writing its log into the output folder (default
# gpu-check/, git-ignored):
#   1. build    configure and build with the CUDA backend for the GPU present (its compute capability
#               from nvidia-smi; the default architecture list where there is no GPU)
#   2. tests    the whole test suite with DUET_REQUIRE_CUDA=1, so that a CUDA test that skips fails
#   3. selftest duet selftest --device cuda: the op table on the GPU against the reference loops, then
#               the same table timed on the GPU (--mode perf: ms, GFLOP/s and GB/s per case), then
#               the convolution cases with DUET_CUDNN_BENCHMARK=1 (algorithms timed by cudnnFind)
#   4. models   one phase per benchmark model: one profiled epoch on synthetic data in f32, --amp bf16
#               and --amp fp16 on the GPU, the same run on the cpu backend (f32 and bf16), and
#               `duet compare` of the two reports (NVML telemetry is in each CUDA report); then
#               resnet18_cifar, resnet50_cifar and mobilenet_v2 steps with NHWC activations and
#               weights against NCHW (duet profile --memory-format nhwc|nchw)
#   5. nccl     with two GPUs and mpirun: resnet18_cifar on 2 ranks (NCCL) and on one process
#   6. pytorch  where python3 imports torch with CUDA: bench/train_throughput.py --device cuda, duet
#               against PyTorch on this GPU
# and summary.md, one page: the GPU, each phase's result and time, the tables' last lines.
#
# Without an NVIDIA GPU it builds and runs the host-side CUDA tests, then stops with exit code 3 and
# says why (0: every phase passed; 1: a phase failed; 2: bad usage or no CUDA Toolkit).
{ # parsed whole before it runs, so that editing the file during a run cannot change the run
set -uo pipefail

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/gpu-check"; build=""; train_size=1024
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift ;;
    --build-dir) build="$2"; shift ;;
    --train-size) train_size="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown option '$1' (expected --out DIR, --build-dir DIR, --train-size N)" >&2; exit 2 ;;
  esac
  shift
done
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
  echo "== $name (log: $log)"
  "$@" > "$log" 2>&1 || rc=$?
  local verdict="passed"
  if [ $rc -eq 124 ]; then verdict="TIMED OUT (10 min)"; elif [ $rc -ne 0 ]; then verdict="FAILED (exit $rc)"; fi
  [ $rc -eq 0 ] || failed=1
  phase_rows+=("| $name | $verdict | $((SECONDS - t0)) s | \`$(basename "$log")\` |")
  echo "   $verdict in $((SECONDS - t0)) s"
  return $rc
}

write_summary() {
  {
    echo "# duet GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "- commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU: ${gpu_line:-none}"
    echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) logical CPUs"
    echo
    echo "| phase | result | time | log |"
    echo "| --- | --- | ---: | --- |"
    printf '%s\n' "${phase_rows[@]}"
    for f in "$out"/selftest.txt "$out"/pytorch.txt; do
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

nvcc_path=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
if [ -z "$nvcc_path" ]; then
  echo "gpu_check: no nvcc (CUDA Toolkit) found on PATH or in /usr/local/cuda/bin: install the CUDA Toolkit 13 and cuDNN 9" >&2
  exit 2
fi

gpu_line=""
archs=""
if command -v nvidia-smi >/dev/null && gpu_line=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -1) && [ -n "$gpu_line" ]; then
  cap=$(echo "$gpu_line" | cut -d, -f2 | tr -d ' .')
  archs="${cap}-real"
  echo "gpu_check: $gpu_line"
else
  gpu_line=""
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi found none): building and running the host-side CUDA tests only"
fi

# 1. build
if [ -z "$build" ]; then
  build="$repo/build-gpu"
  cfg=(-DDUET_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc_path")
  [ -n "$archs" ] && cfg+=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
  build_it() { cmake -S "$repo" -B "$build" -G Ninja "${cfg[@]}" && timeout 600 cmake --build "$build" -j"$(nproc)"; }
  phase build "$out/build.log" build_it || { write_summary; exit 1; }
fi
duet="$build/duet"
[ -x "$duet" ] || { echo "gpu_check: $duet does not exist: build first or drop --build-dir" >&2; exit 2; }
if ! grep -q "duet_cuda" "$build/build.ninja" 2>/dev/null; then
  echo "gpu_check: $build was configured without the CUDA backend (reconfigure with -DDUET_CUDA=ON)" >&2
  exit 2
fi

if [ -z "$gpu_line" ]; then
  phase "host-side CUDA tests" "$out/tests_host.log" timeout 600 ctest --test-dir "$build" --output-on-failure -R "test_cuda_(host|allocator)\\."
  write_summary
  echo "gpu_check: stopped before the phases that need a GPU (none here); run this on a machine with an NVIDIA GPU"
  [ $failed -eq 0 ] && exit 3 || exit 1
fi

# 2. tests: every suite, a CUDA skip counts as a failure
phase "tests (DUET_REQUIRE_CUDA=1)" "$out/tests.log" env DUET_REQUIRE_CUDA=1 timeout 600 ctest --test-dir "$build" --output-on-failure -j"$(nproc)"

# 3. selftest
phase selftest "$out/selftest.txt" timeout 600 "$duet" selftest --device cuda
phase "selftest --mode perf" "$out/selftest_perf.txt" timeout 600 "$duet" selftest --device cuda --mode perf
# The convolutions again with algorithms chosen by timing (cudnnFind) instead of the heuristics.
phase "selftest conv, DUET_CUDNN_BENCHMARK=1" "$out/selftest_benchmark.txt" env DUET_CUDNN_BENCHMARK=1 timeout 600 \
  "$duet" selftest --device cuda --filter conv

# 4. models: one profiled epoch each, on the GPU (f32, bf16, fp16) and on the cpu backend (f32, bf16),
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
for spec in "resnet18_cifar 32 10" "resnet50_cifar 32 10" "densenet121 32 10" "mobilenet_v2 32 10" "vit_tiny_p4 32 10" \
            "resnet18 128 2"; do
  read -r m size classes <<< "$spec"
  phase "model $m at $size px: f32/bf16/fp16 on the GPU, f32/bf16 on the cpu backend" "$out/model_${m}_${size}.log" \
    run_model "$m" "$size" "$classes"
done

# 4b. channels-last on the GPU: activations and weights NHWC (--memory-format nhwc converts the
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
phase "NHWC against NCHW on the GPU (resnet18_cifar, resnet50_cifar, mobilenet_v2)" "$out/layouts.log" nhwc_run

# 5. data-parallel on two GPUs through NCCL, where there are two and mpirun: 2 ranks with batch 32
# against one process with batch 64 (the parameters should agree to f32 rounding; see the log)
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ] && command -v mpirun >/dev/null; then
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

# 6. PyTorch on the same GPU, where it is importable with CUDA
if python3 -c "import torch, torchvision, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  phase "duet against PyTorch on this GPU" "$out/pytorch.txt" timeout 600 python3 "$repo/bench/train_throughput.py" --duet "$duet" \
    --device cuda --steps 20 --warmup 5 --json "$out/pytorch.json"
else
  phase_rows+=("| duet against PyTorch on this GPU | skipped: python3 has no torch with CUDA | | |")
fi

write_summary
exit $failed
}
