#!/usr/bin/env bash
# The first GPU run rehearsed on a machine without a GPU, so that a lent GPU machine's few minutes
# are not spent on what has nothing to do with the GPU. It
#   1. packs the bundle (scripts/gpu_bundle.sh; --build-dir reuses a CUDA build, else the bundle's
#      own x86-64-v3 build for H100/H200, --arch 90-real),
#   2. measures what the device tool would carry (tracked and untracked-not-ignored files plus the
#      bundle) against its 64 MiB limit,
#   3. makes a minimal root that holds what the GPU machine's image holds and nothing of duet's build
#      dependencies: Debian 12's minbase, Python, and the CUDA runtime, cuBLAS, cuDNN, NVRTC and NCCL from
#      PyPI's nvidia-* wheels (downloaded once into --wheels, default ~/.cache/duet/gpu-wheels),
#   4. runs the device command there (scripts/gpu_device_run.sh, with OUT set as the tool sets it)
#      and checks that it got as far as a machine without a GPU can: the bundle loads, its host-side
#      CUDA tests pass, gpu_check stops with its "no GPU" exit (3), and what comes back is at most 8
#      files of at most 16 MiB.
#
#   sudo scripts/gpu_rehearsal.sh                      # the bundle as it will travel (its own build)
#   sudo scripts/gpu_rehearsal.sh --build-dir build    # pack an existing CUDA build instead (CI)
#
# Needs root (mmdebstrap, chroot, mounts), Debian's mirror and PyPI the first time. Prints each step
# with its time; exits non-zero if one failed.
{ # parsed whole before it runs, so that editing the file during a run cannot change the run
set -euo pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
repo=$(cd "$(dirname "$0")/.." && pwd -P)
build=""; wheels="${XDG_CACHE_HOME:-$HOME/.cache}/duet/gpu-wheels"; keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift ;;
    --wheels) wheels="$2"; shift ;;
    --keep) keep=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_rehearsal: unknown option '$1' (expected --build-dir DIR, --wheels DIR, --keep)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "gpu_rehearsal: needs root (mmdebstrap, chroot and mounts): run it with sudo" >&2; exit 2; }
command -v mmdebstrap > /dev/null || {
  echo "gpu_rehearsal: installing mmdebstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap > /dev/null; }

# The versions of the nvidia-* wheels a CUDA 13.0 PyTorch (the GPU image's torch 2.11+cu130) brings.
wheel_specs=("nvidia-cuda-runtime==13.0.96" "nvidia-cuda-nvrtc==13.0.88" "nvidia-cublas==13.0.2.14"
             "nvidia-cudnn-cu13==9.13.1.26" "nvidia-nccl-cu13==2.27.7")
limit=$((64 * 1024 * 1024))

names=(); times=(); results=()
step() {  # step <name> <command...>
  local name="$1" t0=$SECONDS rc=0; shift
  echo; echo "== $name"
  "$@" || rc=$?
  names+=("$name"); times+=($((SECONDS - t0)))
  if [ $rc -eq 0 ]; then results+=("passed"); else results+=("FAILED (exit $rc)"); fi
  return $rc
}
work=$(mktemp -d "${TMPDIR:-/tmp}/duet-rehearsal.XXXXXX")
root="$work/root"
mounts=()
cleanup() {
  local i
  if [ ${#names[@]} -gt 0 ]; then
    echo; echo "== rehearsal summary ($SECONDS s in all)"
    for i in "${!names[@]}"; do printf '%-18s %5ss  %s\n' "${results[$i]}" "${times[$i]}" "${names[$i]}"; done
  fi
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -R "${mounts[$i]}" 2>/dev/null || umount -lR "${mounts[$i]}" 2>/dev/null || true; done
  if grep -qF " $work/" /proc/self/mounts; then echo "gpu_rehearsal: mounts left under $work; not deleting it" >&2
  elif [ "$keep" -eq 1 ]; then echo "gpu_rehearsal: the root stays in $root"
  else rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. the bundle, where the device tool carries it from: the repository root (git-ignored)
bundle_args=(--out "$repo/duet-gpu-bundle.tar.xz")
if [ -n "$build" ]; then bundle_args+=(--build-dir "$build"); else bundle_args+=(--arch 90-real); fi
step "bundle (scripts/gpu_bundle.sh ${bundle_args[*]:2})" "$repo/scripts/gpu_bundle.sh" "${bundle_args[@]}"

# 2. what travels: the files git tracks or does not ignore, and the carried bundle
travel() {
  local tree bundle_bytes total
  tree=$(cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
  bundle_bytes=$(stat -c %s "$repo/duet-gpu-bundle.tar.xz")
  total=$((tree + bundle_bytes))
  awk -v t="$tree" -v b="$bundle_bytes" 'BEGIN {
    printf "working tree %.1f MiB + bundle %.1f MiB = %.1f MiB of the 64 MiB the device tool carries\n",
           t / 1048576, b / 1048576, (t + b) / 1048576 }'
  [ "$total" -le "$limit" ]
}
step "what travels is under 64 MiB" travel

# 3. the root: minbase, Python, the wheels (as the image's PyTorch has them), the travelling tree
wheels_ready() {
  mkdir -p "$wheels"
  local spec missing=()
  for spec in "${wheel_specs[@]}"; do
    local file="${spec%%==*}"; file="${file//-/_}-${spec##*==}-"
    ls "$wheels/$file"*.whl > /dev/null 2>&1 || missing+=("$spec")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "wheels cached in $wheels"; return 0; }
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 -d "$wheels" "${missing[@]}"
}
step "nvidia-* wheels (${wheel_specs[*]})" wheels_ready
sources=()
if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do [ -s "$f" ] && { sources=("$f"); break; }; done
fi
step "minimal root: Debian 12 minbase and Python, no build dependencies" \
  mmdebstrap --quiet --variant=minbase --mode=root --format=directory --include=python3,xz-utils bookworm "$root" "${sources[@]}"
fill_root() {
  # the wheels unpacked as a site folder (the image's PyTorch has them in its site-packages)
  mkdir -p "$root/opt/wheels"
  local w
  for w in "${wheel_specs[@]}"; do
    local file="${w%%==*}"; file="${file//-/_}-${w##*==}-"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$(ls "$wheels/$file"*.whl | head -1)" "$root/opt/wheels"
  done
  mkdir -p "$root/repo"
  (cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - --ignore-failed-read) | tar -xf - -C "$root/repo"
  cp "$repo/duet-gpu-bundle.tar.xz" "$root/repo/"
  mount -t proc proc "$root/proc"; mounts+=("$root/proc")
  mkdir -p "$root/dev" "$root/sys"
  mount --rbind /dev "$root/dev"; mounts+=("$root/dev")
  mount --rbind /sys "$root/sys"; mounts+=("$root/sys")  # lscpu reads the CPU from /sys
  echo "root: $(du -sh --exclude=proc --exclude=dev "$root" | cut -f1), of which wheels $(du -sh "$root/opt/wheels" | cut -f1)"
}
step "the travelling tree and the wheels in the root" fill_root

# 4. the device command, as the device tool runs it: in the repository root, OUT set
device_run() {
  local rc=0
  mkdir -p "$root/out"
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 OUT=/out PYTHONPATH=/opt/wheels /bin/bash -c 'cd /repo && scripts/gpu_device_run.sh' || rc=$?
  echo "device command: exit $rc (3: stopped before the phases that need a GPU)"
  local n bad
  n=$(ls "$root/out" | wc -l)
  bad=$(find "$root/out" -type f -size +16M | wc -l)
  echo "what comes back: $n files ($(cd "$root/out" && ls | tr '\n' ' ')), $bad over 16 MiB"
  [ "$rc" -eq 3 ] && [ "$n" -le 8 ] && [ "$bad" -eq 0 ] &&
    grep -q "host-side CUDA tests | passed" "$root/out/summary.md" && grep -q "^- GPU: none" "$root/out/summary.md"
}
step "scripts/gpu_device_run.sh in the root, up to the first GPU call" device_run
}
