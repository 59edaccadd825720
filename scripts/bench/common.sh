# shellcheck shell=bash
# Its functions set variables for the scripts that source it (SC2034), and bench_cortado's one
# argument is optional (SC2119, SC2120).
# shellcheck disable=SC2034,SC2119,SC2120
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
#   bench_option HELP_LINES ARG...
#                  takes the option at the head of ARG... that comm.sh and ucx.sh share: --sizes
#                  LO:HI, --rounds N and --build DIR set sizes, rounds and build; -h or --help
#                  prints lines HELP_LINES (2,18) of the script and exits; anything else is an
#                  unknown option (exit 2). Sets bench_shift to how many arguments it took.
#   bench_sizes LO:HI
#                  sets lo and hi to the bytes of the two ends of a --sizes range (4K:128M)
#   bench_need TOOL...
#                  exits naming the first TOOL not found, with the command that installs it
#   bench_scratch  sets work to a fresh temporary folder; at exit the background jobs are
#                  killed and the folder removed
#   bench_free_port
#                  prints a free TCP port on 127.0.0.1
#   bench_machine  prints "# <date> <kernel> <arch>, <N> cores, <CPU model>"
#   bench_gloo N   runs scripts/bench/comm/gloo_allreduce.py "$lo" "$hi" on N local ranks
#                  (torch.distributed, one thread each); rank r's output goes to $work/gloo.r
#   bench_mpi_build
#                  compiles scripts/bench/comm/mpi_allreduce.c to $work/mpi_allreduce
#   bench_photos NAME HELPER
#                  the set-up of the scripts that time work on photos: sets rounds (ROUNDS, 3),
#                  work (BENCH_DIR, data-cache/bench_NAME, created), photos (PHOTOS, opencv-doc's
#                  examples) and helper (scripts/bench/HELPER), and calls bench_cortado
#   bench_train_setup NAME
#                  the set-up of the scripts that time `cortado bench train`: sets rounds
#                  (ROUNDS, 3), iters (ITERS, 2), warmup (WARMUP, 1) and threads (THREADS, 2),
#                  calls bench_cortado and bench_out NAME, and records the load before the runs
#   bench_train_config MODEL FILE
#                  writes FILE, a run config of MODEL on synthetic data (batch 16, 224x224)
#   bench_train_finish SUMMARIZE
#                  records the load after the runs, prints the table of scripts/bench/SUMMARIZE
#                  over $out/results.jsonl (also to $out/summary.md) and names the raw results
set -euo pipefail

bench_me=$(basename "$0")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
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

bench_option() {
  local help=$1
  shift
  bench_shift=2
  case "$1" in
    --sizes) sizes=$2 ;;
    --rounds) rounds=$2 ;;
    --build) build=$2 ;;
    -h|--help) sed -n "${help}p" "$0"; exit 0 ;;
    *) echo "$bench_me: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
}

bench_sizes() {
  lo=$(bench_to_bytes "${1%%:*}")
  hi=$(bench_to_bytes "${1##*:}")
}

bench_need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null ||
      { echo "$bench_me: '$tool' not found; run scripts/setup.sh --bench" >&2; exit 1; }
  done
}

bench_scratch() {
  work=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
}

bench_free_port() {
  "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

bench_machine() {
  echo "# $(date -Is) $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
}

bench_gloo() {
  local port r
  port=$(bench_free_port)
  for r in $(seq 0 $(($1 - 1))); do
    RANK=$r WORLD_SIZE=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      "$py" "$root/scripts/bench/comm/gloo_allreduce.py" "$lo" "$hi" > "$work/gloo.$r" &
  done
  wait
}

bench_mpi_build() {
  mpicc -O2 -o "$work/mpi_allreduce" "$root/scripts/bench/comm/mpi_allreduce.c"
}

bench_photos() {
  rounds=${ROUNDS:-3}
  work=${BENCH_DIR:-data-cache/bench_$1}
  photos=${PHOTOS:-/usr/share/doc/opencv-doc/examples/data}
  helper=scripts/bench/$2
  bench_cortado
  mkdir -p "$work"
}

# Stops with one line when the PyTorch peer is missing (before any run, not in the middle).
bench_peer_torch() {
  "$py" -c 'import torch, torchvision' 2>/dev/null || {
    echo "scripts/bench: the PyTorch peer is not installed for $py: apt-get install python3-torch python3-torchvision" >&2
    exit 1
  }
}

bench_train_setup() {
  rounds=${ROUNDS:-3}
  iters=${ITERS:-2}
  warmup=${WARMUP:-1}
  threads=${THREADS:-2}
  bench_peer_torch
  bench_cortado
  bench_out "$1"
  bench_load before "$out/info.txt"
}

bench_train_config() {
  printf 'model: {builder: %s, num_classes: 1000}\ndata: {type: synthetic, batch_size: 16, crop: 224}\nsolver: {base_lr: 0.01, momentum: 0.9, max_iter: 1000}\n' "$1" > "$2"
}

bench_train_finish() {
  bench_load after "$out/info.txt"
  "$py" "scripts/bench/$1" "$out/results.jsonl" | tee "$out/summary.md"
  echo "Raw results: $out" >&2
}
