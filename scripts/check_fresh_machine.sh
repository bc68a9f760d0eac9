#!/usr/bin/env bash
# The README's set-up, tried where a new user starts: a minimal Debian 12 system with nothing
# installed but what ./scripts/setup.sh installs. Builds that system with mmdebstrap in a temporary
# folder, puts a fresh clone of this repository's HEAD inside (and ../shared, read-only, where it
# exists), and runs the README's two commands there word for word, as the README writes them. It
# prints what passed, what failed and how long each took, and exits non-zero if any failed.
#
#   sudo scripts/check_fresh_machine.sh                 # the check as a new user meets it
#   sudo scripts/check_fresh_machine.sh --cuda          # also mount this machine's CUDA Toolkit
#   sudo scripts/check_fresh_machine.sh --ccache        # reuse this machine's compiler cache (CI)
#
# --cuda bind-mounts this machine's CUDA Toolkit (/usr/local/cuda, not a Debian package) read-only
# at the same place and puts its bin/ on PATH, as NVIDIA's install guide tells users to; without it
# the system inside has no nvcc and duet builds without the CUDA backend.
# --ccache mounts this machine's ccache folder, so that objects compiled here before are reused: the
# clone sits at the same absolute path inside as this checkout does outside, so the compile commands
# are identical. It changes how long the build takes, not what it needs: a header or library missing
# inside still fails, because ccache hashes the files a compile read, which must exist inside too.
#
# Needs root (mmdebstrap in root mode, chroot, bind mounts) and Debian's package mirror.
# Uncommitted changes are not in the clone: commit first.
{ # bash reads a script as it runs it: the braces make it parse the whole file first, so that editing
  # the file during a run cannot change what the run does.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
cuda=0; use_ccache=0; keep=0; log=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=1 ;;
    --ccache) use_ccache=1 ;;
    --keep) keep=1 ;;                  # leave the Debian root in place for inspection
    --log) log="$2"; shift ;;          # also write the whole transcript to this file
    -h|--help) usage; exit 0 ;;
    *) echo "check_fresh_machine: unknown option '$1' (expected --cuda, --ccache, --keep, --log FILE)" >&2; exit 2 ;;
  esac
  shift
done

repo=$(cd "$(dirname "$0")/.." && pwd -P)
if [ "$(id -u)" -ne 0 ]; then
  echo "check_fresh_machine: needs root (mmdebstrap --mode=root, chroot and bind mounts): run it with sudo" >&2
  exit 2
fi
if [ -n "$log" ]; then exec > >(tee "$log") 2>&1; fi
if ! command -v mmdebstrap >/dev/null; then
  echo "check_fresh_machine: installing mmdebstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

# The README's two set-up commands: the indented lines that start with ./scripts/setup.sh.
mapfile -t commands < <(sed -n 's/^    \(\.\/scripts\/setup\.sh && .*\)$/\1/p' "$repo/README.md")
if [ ${#commands[@]} -ne 2 ]; then
  echo "check_fresh_machine: expected the README's two set-up commands (indented lines starting with" \
       "./scripts/setup.sh), found ${#commands[@]}" >&2
  exit 2
fi

names=(); times=(); results=()
work=$(mktemp -d "${TMPDIR:-/tmp}/duet-fresh.XXXXXX")
root="$work/root"
mounts=()
summary() {
  [ ${#names[@]} -gt 0 ] || return 0
  echo
  echo "== summary (CUDA Toolkit mounted: $([ $cuda -eq 1 ] && echo yes || echo no); this machine's ccache: $([ $use_ccache -eq 1 ] && echo yes || echo no))"
  local i
  for i in "${!names[@]}"; do printf '%-7s %6ss  %s\n' "${results[$i]%% *}" "${times[$i]}" "${names[$i]}"; done
}
cleanup() {
  local i
  summary
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -R "${mounts[$i]}" 2>/dev/null || umount -lR "${mounts[$i]}" 2>/dev/null || true; done
  # Mounts that what ran inside made there (`ip netns add` binds the root's /run/netns, the hosts
  # tests' probe), deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/self/mounts | sort -r)
  # Never delete through a mount that is still there: /dev, the ccache folder and the data are the
  # host's own.
  if grep -qF " $work/" /proc/self/mounts; then
    echo "check_fresh_machine: some mounts under $work could not be removed; not deleting it" >&2
  elif [ "$keep" -eq 1 ]; then
    echo "check_fresh_machine: the Debian root stays in $root"
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
bind() {  # bind <source> <target inside the root> [ro]
  mkdir -p "$root$2"
  mount --rbind "$1" "$root$2"
  mounts+=("$root$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$root$2"; fi
}

step() {  # step <name> <command...>: run, time and record
  local name="$1"; shift
  local t0=$SECONDS rc=0
  echo
  echo "== $name"
  "$@" || rc=$?
  names+=("$name"); times+=($((SECONDS - t0)))
  if [ $rc -eq 0 ]; then results+=("passed"); else results+=("FAILED (exit $rc)"); fi
  return $rc
}

# Debian 12's minimal base (apt, dpkg, bash, coreutils); this machine's own apt sources when it is a
# Debian 12 machine, otherwise mmdebstrap's default mirror.
sources=()
if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [ -s "$f" ]; then sources=("$f"); break; fi
  done
fi
step "minimal Debian 12 root (mmdebstrap --variant=minbase)" \
  mmdebstrap --quiet --variant=minbase --mode=root --format=directory bookworm "$root" "${sources[@]}"

# The clone sits at this checkout's absolute path, ../shared beside it, as on this machine.
inside_repo="$repo"
step "fresh clone of HEAD ($(git -C "$repo" rev-parse --short HEAD))" \
  git clone --quiet --no-hardlinks "$repo" "$root$inside_repo"
if [ -d "$repo/../shared" ]; then bind "$(cd "$repo/../shared" && pwd -P)" "$(dirname "$inside_repo")/shared" ro; fi

mount -t proc proc "$root/proc"; mounts+=("$root/proc")
bind /dev /dev
bind /sys /sys
cp -L /etc/resolv.conf "$root/etc/resolv.conf"

path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
envs=(HOME=/root LANG=C.UTF-8 TERM=dumb)
if [ "$cuda" -eq 1 ]; then
  [ -x /usr/local/cuda/bin/nvcc ] || { echo "check_fresh_machine: --cuda: no /usr/local/cuda/bin/nvcc on this machine" >&2; exit 2; }
  toolkit=$(readlink -f /usr/local/cuda)
  bind "$toolkit" "$toolkit" ro
  [ "$toolkit" = /usr/local/cuda ] || ln -s "$toolkit" "$root/usr/local/cuda"
  path=/usr/local/cuda/bin:$path
fi
if [ "$use_ccache" -eq 1 ]; then
  command -v ccache >/dev/null || { echo "check_fresh_machine: --ccache: ccache is not installed here" >&2; exit 2; }
  cache=$(ccache --get-config cache_dir)
  mkdir -p "$cache"
  bind "$cache" /root/ccache-host
  envs+=(CCACHE_DIR=/root/ccache-host)
  # The same key settings as outside (CI exports them), so that a compile inside hashes alike in any
  # checkout folder: paths relative to the base folder, and the working folder left out of the hash.
  base=$(ccache --get-config base_dir)
  [ -n "$base" ] && envs+=(CCACHE_BASEDIR="$base")
  [ "$(ccache --get-config hash_dir)" = false ] && envs+=(CCACHE_NOHASHDIR=1)
fi
envs+=(PATH="$path")
[ -n "${DUET_REQUIRE_DATA:-}" ] && envs+=(DUET_REQUIRE_DATA="$DUET_REQUIRE_DATA")
[ -n "${DUET_REQUIRE_MPI:-}" ] && envs+=(DUET_REQUIRE_MPI="$DUET_REQUIRE_MPI")  # setup.sh installs Open MPI inside too

status=0
for i in "${!commands[@]}"; do
  step "README command $((i + 1)): ${commands[$i]}" \
    chroot "$root" /usr/bin/env -i "${envs[@]}" /bin/bash -c "cd '$inside_repo' && ${commands[$i]}" || status=1
done
exit $status
}
