#!/usr/bin/env bash
# Several machines on this one: N "hosts", each a network namespace with its own network stack,
# address, hostname and /etc/hosts, joined by veth pairs to a bridge (a "switch" namespace), and
# Open MPI launching across them with a remote agent that enters a host's namespace where a
# cluster's would ssh into it. Nothing is added to this machine's own network namespace: the
# veths are made inside the namespaces, so removing the namespaces removes every device.
#
#   scripts/hosts.sh up N [--slots S] [--cpus-per-host C]   N hosts, S slots each in the hostfile
#   scripts/hosts.sh down                  every namespace, file and process `up` made; idempotent
#   scripts/hosts.sh mpirun ARGS...        mpirun on host 1 over the hosts (hostfile, agent, TCP subnet)
#   scripts/hosts.sh exec HOST CMD...      CMD on HOST (its namespace, hostname and CPUs)
#   scripts/hosts.sh cut HOST | heal HOST  HOST's link down (a host falling off the network) / up
#   scripts/hosts.sh throttle RATE | off   every host's link limited to RATE (tc tbf: 1gbit, 10gbit)
#   scripts/hosts.sh pids [HOST]           the processes on each host (ip netns pids)
#   scripts/hosts.sh check                 whether this machine lets us make hosts (exit 77 if not)
#   scripts/hosts.sh info                  the hosts, addresses, hostfile and the mpirun command
#
# Hosts are named PREFIX-h1 .. PREFIX-hN (PREFIX: $DUET_HOSTS_PREFIX, default "duet"), so that a
# leftover is found with `ip netns list | grep ^duet-`; addresses $DUET_HOSTS_NET.11, .12, ...
# (default 10.77.0.0/24); the hostfile and the agent go in $DUET_HOSTS_DIR (default
# ${TMPDIR:-/tmp}/PREFIX-hosts). Needs root (ip netns, unshare), iproute2 and util-linux. Where the
# kernel or a sandbox refuses namespaces, `up` and `check` say so and exit 77 (the tests then skip,
# or fail under DUET_REQUIRE_HOSTS=1: tests/hosts/with_hosts.sh).
set -euo pipefail
prefix=${DUET_HOSTS_PREFIX:-duet}
net=${DUET_HOSTS_NET:-10.77.0}
dir=${DUET_HOSTS_DIR:-${TMPDIR:-/tmp}/$prefix-hosts}
switch=$prefix-sw
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

die() { echo "hosts.sh: $*" >&2; exit 1; }
refused() { echo "hosts.sh: cannot make hosts on this machine: $*" >&2; exit 77; }

# The namespaces of this prefix that exist now (hosts and the switch).
ours() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-(h[0-9]+|sw)\$" || true; }
hosts() { ours | grep -E -- "-h[0-9]+\$" | sort -t h -k2 -n || true; }
host_ns() {  # "2", "h2" or "duet-h2" -> duet-h2
  case $1 in
    "$prefix"-h*) echo "$1" ;;
    h[0-9]*) echo "$prefix-$1" ;;
    [0-9]*) echo "$prefix-h$1" ;;
    *) die "no host '$1' (hosts: $(hosts | tr '\n' ' '))" ;;
  esac
}

check() {
  [ "$(id -u)" = 0 ] || refused "needs root (network namespaces, unshare --uts); run it with sudo"
  command -v ip >/dev/null || refused "ip (iproute2) not found: apt-get install iproute2"
  command -v unshare >/dev/null || refused "unshare (util-linux) not found"
  local probe=$prefix-probe$$ err
  if ! err=$(ip netns add "$probe" 2>&1); then refused "ip netns add: ${err:-failed} (the kernel or a sandbox refuses network namespaces)"; fi
  if ! err=$(ip netns exec "$probe" unshare --uts true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refused "entering a namespace: ${err:-failed}"
  fi
  if ! err=$(ip link add pa netns "$probe" type veth peer name pb netns "$probe" 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refused "veth pairs: ${err:-failed}"
  fi
  ip netns del "$probe"
}

# Runs a command on host $1: inside its network namespace (ip netns exec also puts
# /etc/netns/NS/hosts over /etc/hosts), with its own hostname (a UTS namespace) and, with
# --cpus-per-host, only its CPUs (an affinity mask, as a cpuset would give a container).
on_host() {
  local ns; ns=$(host_ns "$1"); shift
  [ -e "/run/netns/$ns" ] || die "host $ns does not exist (scripts/hosts.sh up N)"
  local cpus=""
  [ -f "$dir/cpus.$ns" ] && cpus=$(cat "$dir/cpus.$ns")
  if [ -n "$cpus" ]; then
    exec ip netns exec "$ns" unshare --uts taskset -c "$cpus" sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
  fi
  exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

down() {
  local ns pid left
  for ns in $(ours); do  # first every process on the hosts, then the namespaces
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -CONT "$pid" 2>/dev/null || true; kill -KILL "$pid" 2>/dev/null || true; done
  done
  for ns in $(ours); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1; done
    ip netns del "$ns" 2>/dev/null || echo "hosts.sh: could not remove namespace $ns" >&2
  done
  for ns in /etc/netns/"$prefix"-h* /etc/netns/"$prefix"-sw; do [ -e "$ns" ] && rm -rf "$ns"; done
  rmdir /etc/netns 2>/dev/null || true  # only when nothing else uses it
  rm -rf "$dir"
  left=$(ours)
  [ -z "$left" ] || die "left behind: $left"
}

up() {
  local n=${1:-}; shift || true
  local slots=2 cpus_per_host=0
  while [ $# -gt 0 ]; do
    case $1 in
      --slots) slots=$2; shift 2 ;;
      --cpus-per-host) cpus_per_host=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 32 ] || die "up N: N from 1 to 32 hosts"
  check
  if [ -n "$(ours)" ]; then
    # A set of hosts whose owner still holds the lock is in use; any other is a leftover.
    if [ -f "$dir/lock" ] && ! flock -n "$dir/lock" true; then die "hosts of prefix '$prefix' are in use (DUET_HOSTS_PREFIX picks another set)"; fi
    echo "hosts.sh: removing leftover hosts of an earlier run: $(ours | tr '\n' ' ')" >&2
    down
  fi
  mkdir -p "$dir" "/etc/netns"
  : >"$dir/hostfile"
  ip netns add "$switch"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  ip -n "$switch" link set lo up
  local i ns addr hosts_file
  hosts_file="127.0.0.1 localhost"$'\n'
  for i in $(seq 1 "$n"); do hosts_file+="$net.$((10 + i)) $prefix-h$i"$'\n'; done
  local ncpu; ncpu=$(nproc --all)
  for i in $(seq 1 "$n"); do
    ns=$prefix-h$i
    addr=$net.$((10 + i))
    ip netns add "$ns"
    ip link add eth0 netns "$ns" type veth peer name "h$i" netns "$switch"
    ip -n "$switch" link set "h$i" master br0 up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # TCP gives up on a peer that acknowledges nothing after about 3 s (retries at 0.2, 0.4, 0.8,
    # 1.6 s) instead of the default 15 retries (about 15 minutes): a cluster that wants a host cut
    # off the network noticed sets this lower too. It is this host's kernel setting (one per
    # network namespace), not the machine's: mpirun's connection to the daemon of a host that fell
    # off the network has unacknowledged data, so keepalive probes (below) never start on it.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=3
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts_file" >"/etc/netns/$ns/hosts"
    echo "$ns slots=$slots" >>"$dir/hostfile"
    if [ "$cpus_per_host" -gt 0 ]; then  # host i gets CPUs (i-1)*C .. i*C-1, wrapping around the machine's
      local first=$(( ((i - 1) * cpus_per_host) % ncpu ))
      seq -s, "$first" $((first + cpus_per_host - 1)) | awk -v n="$ncpu" -F, '{for (k = 1; k <= NF; k++) printf "%s%d", (k > 1 ? "," : ""), $k % n}' >"$dir/cpus.$ns"
    fi
  done
  # Open MPI's remote agent: "agent HOST command..." runs the command on HOST, as ssh would.
  cat >"$dir/agent" <<EOF
#!/bin/sh
# Open MPI's remote agent for the hosts of scripts/hosts.sh (--mca plm_rsh_agent): runs the
# command on the host, in its namespace, as ssh HOST command would.
host=\$1; shift
exec "$self" exec "\$host" sh -c "\$*"
EOF
  chmod +x "$dir/agent"
  : >"$dir/lock"
  echo "hosts.sh: $n hosts up: $(for i in $(seq 1 "$n"); do printf '%s-h%d (%s.%d) ' "$prefix" "$i" "$net" $((10 + i)); done)"
  echo "hosts.sh: hostfile $dir/hostfile, agent $dir/agent"
}

# mpirun's options for these hosts: the hostfile, the agent in place of ssh, TCP between hosts
# and shared memory within one (the ob1 messaging layer: Debian's Open MPI would otherwise try UCX),
# both kinds of traffic on the hosts' subnet only, and TCP keepalive probes on the launcher's
# connections (2 s idle, then 3 probes 1 s apart), so that mpirun notices a host cut off from the
# network in about 5 s instead of Open MPI's default 300 s + 9 x 20 s.
mpirun_args() {
  [ -f "$dir/hostfile" ] || die "no hosts (scripts/hosts.sh up N)"
  echo "--hostfile $dir/hostfile --mca plm_rsh_agent $dir/agent --mca pml ob1 --mca btl tcp,vader,self"\
       "--mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24"\
       "--mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3"
}

cmd=${1:-}; shift || true
case $cmd in
  up) up "$@" ;;
  down) down ;;
  check) check; echo "hosts.sh: network namespaces, veth pairs and UTS namespaces work here" ;;
  exec) [ $# -ge 2 ] || die "exec HOST CMD..."; on_host "$@" ;;
  mpirun)
    export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
    # shellcheck disable=SC2046
    on_host 1 mpirun $(mpirun_args) "$@" ;;
  mpirun-args) mpirun_args ;;
  cut | heal)
    [ $# -eq 1 ] || die "$cmd HOST"
    ip -n "$(host_ns "$1")" link set eth0 "$([ "$cmd" = cut ] && echo down || echo up)" ;;
  throttle)
    [ $# -eq 1 ] || die "throttle RATE|off (RATE as tc writes it: 1gbit, 10gbit)"
    for ns in $(hosts); do
      tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
      # tbf: a token bucket of RATE; a burst of 1 ms at that rate (at least 64 KB), 50 ms of queue.
      [ "$1" = off ] || tc -n "$ns" qdisc add dev eth0 root tbf rate "$1" burst 1mbit latency 50ms
    done ;;
  pids)
    for ns in $( [ $# -ge 1 ] && host_ns "$1" || ours); do
      echo "$ns: $(ip netns pids "$ns" | xargs -r ps -o pid=,stat=,comm= -p | tr '\n' ';')"
    done ;;
  info)
    for ns in $(hosts); do echo "$ns $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}') cpus=$(cat "$dir/cpus.$ns" 2>/dev/null || echo all)"; done
    echo "hostfile: $dir/hostfile"; cat "$dir/hostfile" 2>/dev/null || true
    echo "mpirun $(mpirun_args)" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
