#!/usr/bin/env bash
# Runs a command inside namespace <prefix>-a or <prefix>-b of the test network that up.sh
# built: a thin wrapper over `ip netns exec` that checks the namespace exists first. The
# environment and working directory are kept, and the command replaces this script (exec), so
# `$!` of a backgrounded call is the command's own pid. Needs root, as `ip netns exec` does.
#
#   scripts/netem/exec.sh a|b [--prefix cortado] -- CMD [ARGS...]
set -euo pipefail

me=exec.sh
usage() { echo "$me: $*; usage: exec.sh a|b [--prefix NAME] -- CMD [ARGS...]" >&2; exit 2; }

side="" prefix=cortado
while (($#)); do
  case "$1" in
    a|b) [[ -z $side ]] || usage "side given twice"; side=$1; shift ;;
    --prefix) (($# >= 2)) || usage "--prefix needs a value"; prefix=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) usage "unexpected '$1' before --" ;;
  esac
done
[[ -n $side ]] || usage "say which namespace, a or b"
(($#)) || usage "no command after --"
[[ $prefix =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}$ ]] ||
  usage "--prefix '$prefix': use 1-31 letters, digits, '_', '.', '-'"
((EUID == 0)) || { echo "$me: must run as root (ip netns exec needs it)" >&2; exit 1; }

ns=$prefix-$side
ip netns list | awk -v n="$ns" '$1 == n { f = 1 } END { exit !f }' ||
  { echo "$me: namespace $ns does not exist; run scripts/netem/up.sh first" >&2; exit 1; }
exec ip netns exec "$ns" "$@"
