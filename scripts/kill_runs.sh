#!/usr/bin/env bash
# Kills a training run with SIGKILL at random moments, N times, resuming after each kill, and
# checks that the run is never lost: after every kill the checkpoint loads (`duet eval`), and
# after the next write no temporary file of a killed write is left beside it.
#   scripts/kill_runs.sh [N] [DUET]     (default 50 kills of ./build/duet)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
duet=${2:-./build/duet}
dir=$(mktemp -d /tmp/duet_kill_runs.XXXXXX)
trap 'rm -rf "$dir"' EXIT
ck="$dir/ck.safetensors"
# A wide small_cnn (47 MB checkpoints, one every second or so), so that kills land inside writes too.
run=("$duet" train --model small_cnn --width-mult 16 --dataset synthetic --image-size 16 --train-size 256
     --test-size 64 --classes 4 --batch 64 --epochs 100000 --threads 1 --workers 1
     --checkpoint "$ck")
loadable=0 lost=0 debris_left=0 debris_seen=0
for i in $(seq 1 "$n"); do
  args=("${run[@]}")
  [ -f "$ck" ] && args+=(--resume "$ck")
  "${args[@]}" >"$dir/out.txt" 2>&1 &
  pid=$!
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.5 + 2.5 * rand() }')"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  debris=$(find "$dir" -maxdepth 1 -name '.ck.safetensors.tmp-*' | wc -l)
  debris_seen=$((debris_seen + debris))
  if [ -f "$ck" ]; then
    if "$duet" eval "$ck" --threads 1 >/dev/null 2>&1; then
      loadable=$((loadable + 1))
    else
      lost=$((lost + 1))
      echo "kill $i: the checkpoint does not load"
      "$duet" eval "$ck" --threads 1 || true
    fi
  fi
done
# One more run writes the checkpoint once more: every killed write's temporary must be gone.
"${run[@]}" --resume "$ck" --stop-after-epochs 1 >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; lost=$((lost + 1)); }
debris_left=$(find "$dir" -maxdepth 1 -name '.ck.safetensors.tmp-*' | wc -l)
echo "kill_runs: $n kills; checkpoint loadable after $loadable of them (none written yet after $((n - loadable - lost)));" \
     "$lost lost; $debris_seen temporary file(s) seen right after kills; $debris_left left after the next write"
[ "$lost" -eq 0 ] && [ "$debris_left" -eq 0 ]
