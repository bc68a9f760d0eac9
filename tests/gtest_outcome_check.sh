#!/usr/bin/env bash
# How scripts/gpu_check.sh counts a GoogleTest test run in a process of its own (its bundle's test
# phase), on real GoogleTest output: tests/gtest_outcomes.cpp's passing, skipping and failing test,
# and a filter that matches nothing (exit 0, no test run). Issue 41: GoogleTest prints
# "[  SKIPPED ] 1 test, listed below:", which the old parser did not read, so every skip was a failure.
#   tests/gtest_outcome_check.sh <repo> <gtest_outcomes binary>
set -uo pipefail
repo="$1"; bin="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
check() {  # check <filter> <expected outcome>
  local rc=0 got
  "$bin" --gtest_filter="$1" > "$tmp/log" 2>&1 || rc=$?
  got=$("$repo/scripts/gpu_check.sh" --gtest-outcome "$tmp/log" "$rc")
  if [ "$got" = "$2" ]; then
    echo "ok: $1 (exit $rc) -> $got"
  else
    echo "FAILED: $1 (exit $rc) -> $got, expected $2; its output:"; sed 's/^/  | /' "$tmp/log"; status=1
  fi
}
check Outcome.Passes passed
check Outcome.Skips skipped
check Outcome.Fails failed
check Outcome.NoSuchTest failed
exit $status
