#!/usr/bin/env bash
# Kills a training run with SIGKILL at random moments, N times, resuming after each kill, and
# checks that the run is never lost: after every kill the checkpoint loads (`duet eval`), and
# after the next write no temporary file of a killed write is left beside it. A kill that lands
# inside a checkpoint write is counted: a nameless temporary (O_TMPFILE) shows in /proc as an open
# "#<inode> (deleted)" file of the checkpoint's folder, a named one as ".ck.safetensors.tmp-*".
# Odd kills come at a random moment (0.5-3 s after the start); even kills wait until a checkpoint
# write is in progress (up to 10 s), so that the write path is hit on purpose, not only by chance.
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
loadable=0 lost=0 debris_left=0 debris_seen=0 mid_write=0
in_write() {  # whether process $1 is writing the checkpoint now
  ls -l "/proc/$1/fd" 2>/dev/null | grep -q -- "$dir/#.*(deleted)" ||
    [ -n "$(find "$dir" -maxdepth 1 -name '.ck.safetensors.tmp-*' -print -quit)" ]
}
# The run's first epoch and checkpoint, so that every kill below has a checkpoint to resume from
# (on a loaded machine the first write can take longer than a random kill's delay).
"${run[@]}" --stop-after-epochs 1 >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; exit 1; }
for i in $(seq 1 "$n"); do
  args=("${run[@]}" --resume "$ck")
  "${args[@]}" >"$dir/out.txt" 2>&1 &
  pid=$!
  if [ $((i % 2)) -eq 0 ]; then
    deadline=$((SECONDS + 10))
    while [ "$SECONDS" -lt "$deadline" ] && ! in_write "$pid"; do sleep 0.002; done
  else
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.5 + 2.5 * rand() }')"
  fi
  if in_write "$pid"; then mid_write=$((mid_write + 1)); fi
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  debris=$(find "$dir" -maxdepth 1 -name '.ck.safetensors.tmp-*' | wc -l)
  debris_seen=$((debris_seen + debris))
  if "$duet" eval "$ck" --threads 1 >/dev/null 2>&1; then
    loadable=$((loadable + 1))
  else
    lost=$((lost + 1))
    echo "kill $i: the checkpoint does not load"
    "$duet" eval "$ck" --threads 1 || true
  fi
done
# One more run writes the checkpoint once more: every killed write's temporary must be gone.
"${run[@]}" --resume "$ck" --stop-after-epochs 1 >"$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; lost=$((lost + 1)); }
debris_left=$(find "$dir" -maxdepth 1 -name '.ck.safetensors.tmp-*' | wc -l)
echo "kill_runs: $n kills, $mid_write of them inside a checkpoint write; the checkpoint loaded after $loadable of them;" \
     "$lost lost; $debris_seen temporary file(s) seen right after kills; $debris_left left after the next write"
# A run in which no kill caught a write has not tested the write path: a failure too.
[ "$lost" -eq 0 ] && [ "$debris_left" -eq 0 ] && { [ "$n" -lt 2 ] || [ "$mid_write" -gt 0 ]; }
