# shellcheck shell=bash
# The set-up every scripts/bench/*.sh shares. Each one starts with
#   source "$(dirname "$0")/common.sh"
# which sets strict mode, makes the repository root the working directory (relative paths given
# to a script are taken from there) and defines:
#   root           the repository root
#   py             /usr/bin/python3: Debian's, which sees python3-torch, -torchvision and -pil
#                  (the peers' side of every comparison)
#   build          the build folder: CORTADO_BUILD_DIR, else build/ (a script's --build option
#                  sets it before calling bench_cortado)
#   bench_cortado [--build]
#                  sets cortado=$build/tools/cortado; with --build it first configures (Release,
#                  if $build has no cache yet) and builds it incrementally, so the figures are
#                  the current source's (log: $build/bench-build.log; if that fails an existing
#                  binary is used, with a warning). Exits naming the command when there is none.
#   bench_load WHEN [FILE]
#                  prints "# load average WHEN: 1-min 5-min 15-min" (and appends it to FILE), and
#                  warns on stderr when the machine is not idle: a 1-minute average above 0.3
#                  before the runs, or above 2.5 after them (the benchmarks' own 2 threads and
#                  more). Timings taken beside other work (parallel builds) are noise, not
#                  figures for BENCHMARKS.md. Every script records it before and after its runs.
#   bench_out NAME sets out=runs/bench-NAME-<date>, creates it and starts out/info.txt with the
#                  date and commit
#   bench_to_bytes SIZE
#                  prints the bytes of 4K, 16M, 1G (K = 1024) or a plain number
set -euo pipefail

bench_me=$(basename "$0")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck disable=SC2034  # for the scripts that source this
py=/usr/bin/python3
build=${CORTADO_BUILD_DIR:-build}

bench_cortado() {
  cortado=$build/tools/cortado
  if [[ ${1:-} == --build ]]; then
    if [[ ! -f $build/CMakeCache.txt ]]; then
      cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    fi
    echo "$bench_me: building cortado in $build" >&2
    if ! cmake --build "$build" -j "$(nproc)" --target cortado >"$build/bench-build.log" 2>&1; then
      echo "$bench_me: warning: building cortado failed (see $build/bench-build.log)" >&2
    fi
  fi
  [[ -x $cortado ]] ||
    { echo "$bench_me: no $cortado; build it first: cmake --build $build --target cortado" >&2; exit 1; }
}

bench_load() {
  local line
  line="# load average $1: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [[ -n ${2:-} ]]; then echo "$line" | tee -a "$2"; else echo "$line"; fi
  local one limit=2.5
  [[ $1 == before ]] && limit=0.3
  one=$(cut -d' ' -f1 /proc/loadavg)
  if awk -v load="$one" -v limit="$limit" 'BEGIN { exit !(load > limit) }'; then
    echo "$bench_me: warning: the 1-minute load average is $one ($1), above $limit: other work" \
      "is running beside the benchmark, and its timings are noise" >&2
  fi
}

bench_out() {
  out=$root/runs/bench-$1-$(date +%Y%m%d-%H%M%S)
  mkdir -p "$out"
  echo "# $(date -Is) $(git rev-parse --short HEAD 2>/dev/null || echo '?')" >"$out/info.txt"
}

bench_to_bytes() {
  local v=${1^^}
  case "$v" in
    *G) echo $((${v%G} << 30)) ;;
    *M) echo $((${v%M} << 20)) ;;
    *K) echo $((${v%K} << 10)) ;;
    *) echo "$v" ;;
  esac
}
