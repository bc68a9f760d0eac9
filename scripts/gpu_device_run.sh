#!/usr/bin/env bash
# The one command a lent GPU machine runs (docs/cuda_backend.md, "A lent GPU machine"): it unpacks
# the bundle carried with the working tree (scripts/gpu_bundle.sh made it on a machine that builds
# duet), finds cuDNN, cuBLAS and NVRTC in the machine's CUDA Toolkit or its PyTorch's nvidia-* wheels,
# and runs scripts/gpu_check.sh --bundle in the order of what the phases prove: the op table on the
# GPU, the CUDA tests, two training steps against the cpu backend, the per-model profiled epochs,
# NHWC against NCHW, PyTorch on the same GPU, and the cpu backend at the machine's 16 cores against
# PyTorch (thread scaling, issue 45). No phase starts after --deadline, and the whole check
# is stopped at --end (the phase under way is recorded as cut short), so that the command returns
# inside the lease's 10-minute command limit with its summary.
#
#   scripts/gpu_device_run.sh                           # duet-gpu-bundle.tar.xz from the repository root
#   scripts/gpu_device_run.sh --bundle FILE.tar.xz --deadline 420 --end 500
#
# What comes back: at most three files in $OUT (or --out DIR, default gpu-run/): summary.md (the
# GPU, each phase's result and time, the tables' last lines), logs.tar.xz (every log, report and
# comparison; Chrome traces only while the archive stays under 12 MiB) and exit_code. The exit code
# is gpu_check's: 0 every phase passed, 1 a phase failed, 3 no GPU (the rehearsal,
# scripts/gpu_rehearsal.sh, ends there), 124 stopped at --end, 2 the bundle cannot run here.
{ # parsed whole before it runs, so that editing the file during a run cannot change the run
set -uo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
repo=$(cd "$(dirname "$0")/.." && pwd)
archive="$repo/duet-gpu-bundle.tar.xz"; out="${OUT:-$repo/gpu-run}"; deadline=420; end=500
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) archive="$2"; shift ;;
    --out) out="$2"; shift ;;
    --deadline) deadline="$2"; shift ;;
    --end) end="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_device_run: unknown option '$1' (expected --bundle FILE, --out DIR, --deadline S, --end S)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$deadline" =~ ^[0-9]+$ && "$end" =~ ^[0-9]+$ ]] || { echo "gpu_device_run: --deadline and --end take seconds" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "gpu_device_run: cannot make the output folder $out" >&2; exit 2; }
[ -s "$archive" ] || {
  echo "gpu_device_run: no bundle at $archive: make it with ./scripts/gpu_bundle.sh --arch 90-real on a machine that" \
       "builds duet, and carry it with the working tree (docs/cuda_backend.md)" | tee "$out/summary.md" >&2
  echo 2 > "$out/exit_code"; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/duet-gpu-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "gpu_device_run: unpacking $(basename "$archive") ($(du -h "$archive" | cut -f1))"
tar -xJf "$archive" -C "$work" || { echo "gpu_device_run: $archive is not a readable tar.xz" >&2; exit 2; }
bundle="$work/duet-gpu-bundle"
check="$work/check"
mkdir -p "$check"

# The check runs with the phases in the order above; its own --deadline keeps new phases from
# starting late, and timeout stops it at --end (it writes its summary when stopped).
rc=0
timeout -s TERM "$((end > SECONDS ? end - SECONDS : 1))" "$bundle/scripts/gpu_check.sh" --bundle "$bundle" \
  --out "$check" --deadline "$deadline" --only selftest,tests,step,models,layouts,pytorch,cpu || rc=$?
echo "$rc" > "$out/exit_code"

# What comes back: the summary, and one archive of everything else.
if [ -s "$check/summary.md" ]; then cp "$check/summary.md" "$out/summary.md"; else
  echo "gpu_device_run: gpu_check wrote no summary (exit $rc)" > "$out/summary.md"; fi
tar -cJf "$out/logs.tar.xz" -C "$work" check
if [ "$(stat -c %s "$out/logs.tar.xz")" -gt $((12 * 1024 * 1024)) ]; then
  tar -cJf "$out/logs.tar.xz" -C "$work" --exclude='*.trace.json' check
  echo "(Chrome traces left out of logs.tar.xz to keep it under 12 MiB)" >> "$out/summary.md"
fi
echo "gpu_device_run: exit $rc in $SECONDS s; $out: $(cd "$out" && ls | tr '\n' ' ')"
cat "$out/summary.md"
exit "$rc"
}
