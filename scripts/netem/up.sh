#!/usr/bin/env bash
# Builds a two-host test network on this machine, so that two training ranks talk only over a
# rate-limited link: network namespaces <prefix>-a and <prefix>-b, joined by one veth pair
# (veth-a in a, veth-b in b), with <subnet>.1/24 on a and <subnet>.2/24 on b, loopback up in
# each. A token bucket (tc tbf) on the egress of BOTH veth ends limits each direction to RATE.
# On any failure midway it removes the namespaces it created. Needs root, ip and tc.
#
#   scripts/netem/up.sh [--rate 1gbit] [--delay MS] [--queue-ms 5] [--mtu 1500]
#                       [--prefix cortado] [--subnet 10.231.0] [--replace]
#
#   --rate RATE     per direction, in tc's syntax (100mbit, 1gbit, 10gbit, 500kbit, 1gibit,
#                   125mbps = bytes/s), or none for no limit. Default 1gbit.
#   --delay MS      one-way delay added with netem on both ends (the RTT grows by 2*MS); the
#                   kernel needs sch_netem (CONFIG_NET_SCH_NETEM).
#   --queue-ms MS   the link's buffer, as time at RATE; a full queue drops (tail drop). Default 5.
#   --mtu N         the veth MTU (68..65535). Default 1500.
#   --prefix NAME   namespace names <NAME>-a and <NAME>-b. Default cortado.
#   --subnet A.B.C  the /24 of the link. Default 10.231.0.
#   --replace       remove existing namespaces of that prefix first, instead of refusing.
#
# Why tbf, sized this way (measured, README.md): the bucket holds 1 ms of RATE (at least two
# full frames), enough to ride out a late timer without losing tokens, small enough that an
# idle link lets only 1 ms worth of bytes through early. htb's default burst left 1gbit at
# 87% of nominal. tbf charges whole Ethernet frames, GSO super-packets counted per segment,
# so TCP goodput tops out at 1448/1514 = 95.6% of RATE at MTU 1500.
set -euo pipefail

me=up.sh
die() { echo "$me: $*" >&2; exit 1; }
usage() { echo "$me: $*  (see --help)" >&2; exit 2; }

rate=1gbit delay="" queue_ms=5 mtu=1500 prefix=cortado subnet=10.231.0 replace=0
while (($#)); do
  case "$1" in
    --rate|--delay|--queue-ms|--mtu|--prefix|--subnet)
      (($# >= 2)) || usage "$1 needs a value"
      case "$1" in
        --rate) rate=$2 ;;
        --delay) delay=$2 ;;
        --queue-ms) queue_ms=$2 ;;
        --mtu) mtu=$2 ;;
        --prefix) prefix=$2 ;;
        --subnet) subnet=$2 ;;
      esac
      shift 2 ;;
    --replace) replace=1; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done

# --- checks before touching anything -------------------------------------------------------
[[ $prefix =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}$ ]] ||
  usage "--prefix '$prefix': use 1-31 letters, digits, '_', '.', '-'"
octet='(0|[1-9][0-9]{0,2})'
if ! [[ $subnet =~ ^$octet\.$octet\.$octet$ ]] ||
    ((BASH_REMATCH[1] > 255 || BASH_REMATCH[2] > 255 || BASH_REMATCH[3] > 255)); then
  usage "--subnet '$subnet': want three octets, like 10.231.0"
fi
if ! [[ $mtu =~ ^[1-9][0-9]{1,4}$ ]] || ((mtu < 68 || mtu > 65535)); then
  usage "--mtu '$mtu': want 68..65535"
fi
if ! [[ $queue_ms =~ ^[0-9]+(\.[0-9]+)?$ ]] || [[ $queue_ms =~ ^0+(\.0+)?$ ]]; then
  usage "--queue-ms '$queue_ms': want a positive number of milliseconds"
fi
[[ -z $delay || $delay =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
  usage "--delay '$delay': want milliseconds, like 5 or 0.5"

# RATE in bits/s, following tc(8): a bare number or 'bit' is bits/s, 'bps' is bytes/s,
# k/m/g/t are powers of 1000 and ki/mi/gi/ti powers of 1024; units are case-insensitive.
rate_bits=""
if [[ ${rate,,} != none ]]; then
  rate_bits=$(awk -v r="${rate,,}" 'BEGIN {
      if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
      n = substr(r, 1, RLENGTH) + 0; u = substr(r, RLENGTH + 1)
      if (u == "") u = "bit"
      if (!match(u, /^(|k|m|g|t|ki|mi|gi|ti)(bit|bps)$/)) exit 1
      p = substr(u, 1, length(u) - 3); f = (substr(u, length(u) - 2) == "bps") ? 8 : 1
      s["k"] = 1e3; s["m"] = 1e6; s["g"] = 1e9; s["t"] = 1e12
      s["ki"] = 1024; s["mi"] = 1024 ^ 2; s["gi"] = 1024 ^ 3; s["ti"] = 1024 ^ 4
      b = n * f * (p == "" ? 1 : s[p])
      if (b < 8000) exit 1
      printf "%.0f\n", b }') ||
    usage "--rate '$rate': want tc's syntax of at least 8kbit (100mbit, 1gbit, 10gbit) or none"
fi

((EUID == 0)) || die "must run as root (network namespaces and tc need CAP_NET_ADMIN)"
for tool in ip tc; do
  command -v "$tool" >/dev/null || die "'$tool' not found; install iproute2"
done

ns_a=$prefix-a ns_b=$prefix-b
ns_exists() { ip netns list | awk -v n="$1" '$1 == n { f = 1 } END { exit !f }'; }
if ns_exists "$ns_a" || ns_exists "$ns_b"; then
  ((replace)) || die "namespace $ns_a or $ns_b already exists; pass --replace, or run" \
    "scripts/netem/down.sh --prefix $prefix"
  "$(dirname "$0")/down.sh" --prefix "$prefix"
fi

# --- build; from here on a failure removes what was created --------------------------------
# Each step names itself in $step and a failing tool's message lands in $why, so that a
# failure is reported as one line by cleanup.
created=() step=starting why=""
cleanup() {
  local rc=$?
  ((rc == 0)) && return
  for ns in "${created[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  echo "$me: failed while $step${why:+: $why}; removed ${created[*]:-nothing}" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'why="interrupted"; exit 130' INT  # so that Ctrl-C or a kill midway also cleans up
trap 'why="terminated"; exit 143' TERM
run() {
  if ! why=$("$@" 2>&1); then
    why=$(echo "$why" | tr '\n' ' ' | sed 's/ *$//')
    return 1
  fi
  why=""
}

# bytes_in MS [FACTOR]: how many bytes RATE carries in MS milliseconds (times FACTOR).
bytes_in() {
  awk -v b="$rate_bits" -v ms="$1" -v k="${2:-1}" 'BEGIN { printf "%.0f\n", b / 8 * ms / 1000 * k }'
}
max() { if (($1 > $2)); then echo "$1"; else echo "$2"; fi; }

# One frame on the veth is MTU + 14 bytes of Ethernet header: tbf counts skb->len.
frame=$((mtu + 14))

for ns in "$ns_a" "$ns_b"; do
  step="creating namespace $ns"
  run ip netns add "$ns"
  created+=("$ns")
  step="bringing up lo in $ns"
  run ip -n "$ns" link set lo up
done

# Created straight inside the namespaces, so the names never meet the host's interfaces.
step="creating the veth pair"
run ip link add veth-a netns "$ns_a" mtu "$mtu" type veth peer name veth-b netns "$ns_b" mtu "$mtu"

for side in a b; do
  ns=$prefix-$side dev=veth-$side
  host=$([[ $side == a ]] && echo 1 || echo 2)
  step="addressing $dev in $ns"
  run ip -n "$ns" addr add "$subnet.$host/24" dev "$dev"

  # Optional delay first (root netem), the rate limit under it: netem holds each packet for
  # the delay, then tbf paces it. netem's own limit is in packets, so it is sized to hold
  # twice the bytes in flight over the delay, counted in full frames.
  parent=root
  if [[ -n $delay ]]; then
    step="adding netem delay ${delay}ms on $dev"
    netem_limit=100000
    [[ -n $rate_bits ]] && netem_limit=$(max 1000 $(($(bytes_in "$delay" 2) / frame + 1)))
    if ! run tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "${delay}ms" \
        limit "$netem_limit"; then
      [[ $why == *"qdisc kind is unknown"* ]] &&
        why="this kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM) that --delay needs"
      exit 1
    fi
    parent="parent 1:1"
  fi

  if [[ -n $rate_bits ]]; then
    step="adding the $rate limit on $dev"
    burst=$(max "$(bytes_in 1)" $((2 * frame)))
    limit=$(max "$(bytes_in "$queue_ms")" $((2 * burst)))
    # shellcheck disable=SC2086  # $parent is one or two words on purpose
    run tc -n "$ns" qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" \
      burst "$burst" limit "$limit"
  fi
done

for side in a b; do
  step="bringing up veth-$side"
  run ip -n "$prefix-$side" link set "veth-$side" up
done

# Until the kernel's link watcher marks the ends up, the device still has its no-op qdisc
# and drops every packet (a first SYN lost costs the benchmark a 1 s retransmit), so wait.
step="waiting for the link to come up"
for ((i = 0; i < 50; i++)); do
  up=0
  for side in a b; do
    [[ $(ip -n "$prefix-$side" -o link show "veth-$side") == *"state UP"* ]] && up=$((up + 1))
  done
  ((up == 2)) && break
  sleep 0.1
done
((up == 2)) || { why="veth ends not up after 5 s"; exit 1; }

trap - EXIT INT TERM
echo "$me: $ns_a ($subnet.1, veth-a) <-> $ns_b ($subnet.2, veth-b), rate ${rate}" \
  "per direction${delay:+, delay ${delay}ms each way}, mtu $mtu"
