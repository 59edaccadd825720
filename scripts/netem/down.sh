#!/usr/bin/env bash
# Removes the test network that up.sh built: namespaces <prefix>-a and <prefix>-b, and with
# them the veth pair. A process still running inside one would keep that namespace (and the
# link) alive unseen after its name is gone, so those get SIGTERM, then SIGKILL after 2 s.
# Succeeds quietly when there is nothing to remove, so it can sit in a `trap ... EXIT`.
#
#   scripts/netem/down.sh [--prefix cortado]
set -euo pipefail

me=down.sh
prefix=cortado
while (($#)); do
  case "$1" in
    --prefix) (($# >= 2)) || { echo "$me: --prefix needs a value" >&2; exit 2; }
              prefix=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "$me: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $prefix =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}$ ]] ||
  { echo "$me: --prefix '$prefix': use 1-31 letters, digits, '_', '.', '-'" >&2; exit 2; }
((EUID == 0)) || { echo "$me: must run as root" >&2; exit 1; }

ns_exists() { ip netns list | awk -v n="$1" '$1 == n { f = 1 } END { exit !f }'; }

present=()
for ns in "$prefix-a" "$prefix-b"; do
  ns_exists "$ns" && present+=("$ns")
done
((${#present[@]})) || exit 0

pids() { for ns in "${present[@]}"; do ip netns pids "$ns" 2>/dev/null || true; done; }
mapfile -t left < <(pids)
if ((${#left[@]})); then
  kill -TERM "${left[@]}" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    mapfile -t left < <(pids)
    ((${#left[@]})) || break
    sleep 0.1
  done
  ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
fi

for ns in "${present[@]}"; do
  ip netns del "$ns" 2>/dev/null || ! ns_exists "$ns" ||
    { echo "$me: could not remove namespace $ns" >&2; exit 1; }
done
