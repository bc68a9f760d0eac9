#!/usr/bin/env bash
# duet's CUDA side packed for a GPU machine that cannot build it: one that has the NVIDIA driver,
# cuDNN 9 and cuBLAS (from the CUDA Toolkit, or the wheels PyTorch installs), but none of duet's
# build dependencies (oneDNN, fmt, GoogleTest, a Debian package mirror): a cluster's compute node,
# a cloud image made for PyTorch, a machine with no network.
#
#   ./scripts/gpu_bundle.sh                             # build for every GPU generation, pack
#   ./scripts/gpu_bundle.sh --arch 90-real              # machine code for one generation (H100/H200)
#   ./scripts/gpu_bundle.sh --build-dir build --dir B   # pack an existing CUDA build into folder B
#
# and on the GPU machine:
#
#   tar -xJf duet-gpu-bundle.tar.xz && duet-gpu-bundle/scripts/gpu_check.sh --bundle duet-gpu-bundle
#
# The bundle holds bin/ (duet and the test suites that run on a GPU), lib/ (every shared library
# they load apart from the C and C++ runtimes and the NVIDIA stack: oneDNN, fmt, libjpeg, libpng,
# libgomp...), lib/fallback/ (the CUDA runtime, used only where the GPU machine has none),
# scripts/gpu_check.sh, bench/train_throughput.py and MANIFEST (commit, GPU architectures, CPU
# instruction set, what was bundled). cuDNN and cuBLAS are not bundled (they are gigabytes, and must
# match the driver there); gpu_check.sh finds them where they are installed.
#
# The bundle's own build has duet's loops compiled for x86-64-v3 (AVX2 and FMA, every x86 server
# since 2013) instead of -march=native, since the GPU machine's CPU is another one, and no MPI/NCCL:
# it is one process on one GPU (gpu_check's two-GPU phase needs a build on that machine).
{ # parsed whole before it runs, so that editing the file during a run cannot change the run
set -euo pipefail

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
repo=$(cd "$(dirname "$0")/.." && pwd)
arch=""; build=""; dir=""; archive="$repo/duet-gpu-bundle.tar.xz"
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift ;;
    --build-dir) build="$2"; shift ;;
    --dir) dir="$2"; archive=""; shift ;;
    --out) archive="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_bundle: unknown option '$1' (expected --arch LIST, --build-dir DIR, --dir DIR, --out FILE.tar.xz)" >&2
       exit 2 ;;
  esac
  shift
done

suites=(test_cuda_device test_cuda_host test_cuda_allocator test_amp)  # the suites with tests that need a GPU
isa=x86-64-v3
if [ -z "$build" ]; then
  nvcc_path=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
  if [ -z "$nvcc_path" ]; then
    echo "gpu_bundle: no nvcc (CUDA Toolkit) on PATH or in /usr/local/cuda/bin: the bundle needs the CUDA backend" >&2
    exit 2
  fi
  build="$repo/build-bundle"
  cfg=(-DDUET_CUDA=ON -DDUET_MPI=OFF -DDUET_NATIVE=OFF -DDUET_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release
       -DCMAKE_CXX_FLAGS="-march=$isa" -DCMAKE_CUDA_COMPILER="$nvcc_path")
  [ -n "$arch" ] && cfg+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
  cmake -S "$repo" -B "$build" -G Ninja "${cfg[@]}"
  cmake --build "$build" -j"$(nproc)" --target duet_cli "${suites[@]}"
else
  [ -n "$arch" ] && { echo "gpu_bundle: --arch applies to the bundle's own build, not to --build-dir" >&2; exit 2; }
  grep -q "duet_cuda" "$build/build.ninja" 2>/dev/null || {
    echo "gpu_bundle: $build has no CUDA backend (configure it with -DDUET_CUDA=ON)" >&2; exit 2; }
  isa=$(sed -n 's/^CMAKE_CXX_FLAGS:STRING=.*-march=\([^ ]*\).*/\1/p' "$build/CMakeCache.txt")
  grep -q "^DUET_NATIVE:BOOL=ON" "$build/CMakeCache.txt" && isa="native (the CPU that built it)"
  isa=${isa:-x86-64}
fi
for f in duet "${suites[@]/#/tests/}"; do
  [ -x "$build/$f" ] || { echo "gpu_bundle: $build/$f was not built" >&2; exit 2; }
done

staging=$(mktemp -d "${TMPDIR:-/tmp}/duet-bundle.XXXXXX")
trap 'rm -rf "$staging"' EXIT
b="$staging/duet-gpu-bundle"
mkdir -p "$b/bin" "$b/lib/fallback" "$b/scripts" "$b/bench"
cp "$build/duet" "$b/bin/"
for s in "${suites[@]}"; do cp "$build/tests/$s" "$b/bin/"; done
strip "$b"/bin/*
cp "$repo/scripts/gpu_check.sh" "$b/scripts/"
cp "$repo/bench/train_throughput.py" "$b/bench/"

# The libraries the binaries load, as this machine resolves them. Not bundled: the C and C++
# runtimes (the GPU machine's own, which must be at least as new: gpu_check.sh says so if not) and
# the NVIDIA stack, which must match the GPU machine's driver; the CUDA runtime goes to fallback/.
bundled=()
while read -r name path; do
  case "$name" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++*|libgcc_s*) ;;
    libcuda.so*|libcudnn*|libcublas*|libnccl*|libnvidia*) ;;
    libcudart.so*) cp -L "$path" "$b/lib/fallback/" ;;
    *) cp -L "$path" "$b/lib/"; bundled+=("$name") ;;
  esac
done < <(ldd "$b"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)

glibc=$(objdump -T "$b"/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
glibcxx=$(objdump -T "$b"/bin/* 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)
{
  echo "duet GPU bundle"
  echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cuda_architectures: $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "nvcc: $("$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "cpu_isa: $isa"
  echo "needs: $glibc, $glibcxx, the NVIDIA driver, cuDNN 9, cuBLAS 13"
  echo "bundled: ${bundled[*]} $(ls "$b/lib/fallback" | sed 's/^/fallback:/' | tr '\n' ' ')"
} > "$b/MANIFEST"

if [ -n "$dir" ]; then
  rm -rf "$dir"; mkdir -p "$(dirname "$dir")"; mv "$b" "$dir"
  echo "gpu_bundle: $dir ($(du -sh "$dir" | cut -f1))"
else
  XZ_OPT="-6 -T0" tar -cJf "$archive.tmp" -C "$staging" duet-gpu-bundle && mv "$archive.tmp" "$archive"
  echo "gpu_bundle: $archive ($(du -h "$archive" | cut -f1)); on the GPU machine:"
  echo "  tar -xJf $(basename "$archive") && duet-gpu-bundle/scripts/gpu_check.sh --bundle duet-gpu-bundle"
fi
exit 0
}
