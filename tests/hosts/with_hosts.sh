#!/usr/bin/env bash
# Runs a command with N hosts up (scripts/hosts.sh), and takes them down afterwards whatever
# happens: on exit, on Ctrl-C, on SIGTERM (ctest's timeout) or SIGHUP. Where the machine refuses
# network namespaces it says why and exits 77 (ctest: skipped), or 1 under DUET_REQUIRE_HOSTS=1
# (CI, where skipping would hide a broken set-up).
#   tests/hosts/with_hosts.sh N [--cpus-per-host C] -- CMD...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hosts=$here/../../scripts/hosts.sh
n=$1; shift
up_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do up_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
why=$("$hosts" check 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  echo "$why"
  if [ -n "${DUET_REQUIRE_HOSTS:-}" ]; then echo "with_hosts: DUET_REQUIRE_HOSTS is set, and hosts cannot be made here"; exit 1; fi
  [ $rc -eq 77 ] && echo "[  SKIPPED ] several hosts on one machine: $why" && exit 77
  exit 1
fi
child=
cleanup() {
  trap - EXIT INT TERM HUP
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && sleep 1 && kill -KILL "$child" 2>/dev/null
  "$hosts" down || echo "with_hosts: scripts/hosts.sh down failed: check ip netns list" >&2
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 129' HUP
"$hosts" up "$n" "${up_args[@]}" || exit 1
export DUET_HOSTS_N=$n
# The hosts' lock, held while the command runs: a second `up` of the same prefix sees them in use.
exec 9<"${DUET_HOSTS_DIR:-${TMPDIR:-/tmp}/${DUET_HOSTS_PREFIX:-duet}-hosts}/lock"
flock -n 9 || true
"$@" &
child=$!
wait $child
rc=$?
child=
exit $rc
