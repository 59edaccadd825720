#!/usr/bin/env bash
# The UCX transport beside everything it should be compared with, in one run, on this machine:
#   Cortado TCP        cortado bench comm --transport tcp        (under cortado launch)
#   Cortado UCX shm    cortado bench comm --transport ucx, UCX_TLS=sm,self, on registered memory
#                      (as the trainer's gradients: the direct all-reduce above 512 KB)
#   Cortado UCX shm ring   the same on plain memory (--memory plain): the ring, its chunks by
#                      UCX tagged messages (posix/sysv eager, cma zero-copy rendezvous)
#   Cortado UCX tcp    cortado bench comm --transport ucx, UCX_TLS=tcp,self
#   Open MPI           MPI_Allreduce (scripts/bench/comm/mpi_allreduce.c), default transports
#   Gloo               torch.distributed (scripts/bench/comm/gloo_allreduce.py)
#   ucx_perftest       tag_bw and tag_lat point to point, 2 processes (UCX's own ceiling)
# for 2 and 4 ranks (--ranks), f32 sum all-reduce, sizes --sizes (default 4K:128M), --rounds
# rounds in turn (default 3). Cells are bus bandwidth (nccl-tests: all-reduce busbw = algbw x
# 2(n-1)/n; GB/s = 1e9 B/s), median of the rounds [min, max]; the 4 KB latency is the median
# time. The 4 KB latency figures come from separate rounds (--lat-rounds, default 9; Gloo and
# ucx_perftest not included) of --lat-iters (default 20000) timed all-reduces each: a sweep
# round times only 1000 at 4 KB (about 1 ms), too short to be steady on a shared machine.
# Raw JSON lines go to runs/bench-ucx-<time>/, the table to its summary.md.
#
#   scripts/bench/ucx.sh [--sizes 4K:128M] [--ranks 2,4] [--rounds 3] [--lat-rounds 9]
#                        [--lat-iters 20000] [--build DIR] [--no-gloo]
# Needs: a build with the UCX transport (libucx-dev), ucx-utils (ucx_perftest), mpicc/mpirun,
# and /usr/bin/python3 with torch for Gloo (scripts/setup.sh --bench).
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

sizes=4K:128M
ranks_list=2,4
rounds=3
lat_rounds=9
lat_iters=20000
gloo=1
while (($#)); do
  case "$1" in
    --ranks) ranks_list=$2; shift 2 ;;
    --lat-rounds) lat_rounds=$2; shift 2 ;;
    --lat-iters) lat_iters=$2; shift 2 ;;
    --no-gloo) gloo=0; shift ;;
    *) bench_option 2,20 "$@"; shift "$bench_shift" ;;
  esac
done

bench_sizes "$sizes"
bench_need mpicc mpirun ucx_perftest ucx_info
if ((gloo)) && ! "$py" -c 'import torch.distributed' 2>/dev/null; then
  echo "ucx.sh: $py cannot import torch (Gloo); run scripts/setup.sh --bench or pass --no-gloo" >&2
  exit 1
fi

bench_cortado --build
"$cortado" bench comm --help 2>/dev/null | grep -q -- --transport ||
  { echo "ucx.sh: $cortado has no bench comm --transport" >&2; exit 1; }

bench_out ucx
bench_scratch

{
  bench_machine
  echo "# cortado: $cortado ($(git -C "$root" rev-parse --short HEAD)); $(mpirun --version 2>&1 | head -1); $(ucx_info -v | head -1 | sed 's/^# //')"
  echo "# UCX transports here: $(ucx_info -d | awk '/Transport:/ {print $3}' | sort -u | tr '\n' ' ')"
} | tee -a "$out/info.txt"
bench_load before "$out/info.txt"

bench_mpi_build
mpi_flags=(--allow-run-as-root --oversubscribe)

bench() {  # name ranks env... : cortado bench comm under cortado launch (bench_args: extra)
  local name=$1 n=$2; shift 2
  echo "== round $round, $n ranks: $name" >&2
  env "$@" "$cortado" launch --nproc "$n" --no-prefix -- "$cortado" bench comm --sizes "$sizes" --json \
    "${bench_args[@]}" | grep '^{' | sed "s/^{/{\"contender\":\"$name\",$tag/" | tee -a "$out/runs.jsonl" >&2
}
bench_args=()
tag=""

for round in $(seq 1 "$rounds"); do
  for n in ${ranks_list//,/ }; do
    bench "Cortado TCP" "$n" CORTADO_TRANSPORT=tcp
    bench "Cortado UCX shm" "$n" CORTADO_TRANSPORT=ucx UCX_TLS=sm,self
    bench_args=(--memory plain)
    bench "Cortado UCX shm ring" "$n" CORTADO_TRANSPORT=ucx UCX_TLS=sm,self
    bench_args=()
    bench "Cortado UCX tcp" "$n" CORTADO_TRANSPORT=ucx UCX_TLS=tcp,self UCX_NET_DEVICES=lo

    echo "== round $round, $n ranks: Open MPI" >&2
    mpirun "${mpi_flags[@]}" -np "$n" "$work/mpi_allreduce" "$lo" "$hi" mpi \
      | grep '^{' | sed 's/^{/{"contender":"Open MPI",/' | tee -a "$out/runs.jsonl" >&2

    if ((gloo)); then
      echo "== round $round, $n ranks: Gloo" >&2
      bench_gloo "$n"
      grep '^{' "$work/gloo.0" | sed 's/^{/{"contender":"Gloo",/' | tee -a "$out/runs.jsonl" >&2
    fi
  done

  # UCX's own point-to-point rates between two processes: the ceiling for one link.
  echo "== round $round: ucx_perftest tag_bw / tag_lat" >&2
  for ((bytes = lo; bytes <= hi; bytes *= 2)); do
    for test in tag_bw tag_lat; do
      iters=$(( (256 << 20) / bytes )); ((iters < 20)) && iters=20; ((iters > 20000)) && iters=20000
      port=$(bench_free_port)
      ucx_perftest -t "$test" -s "$bytes" -n "$iters" -p "$port" -f > "$work/pf.server" 2>&1 &
      sleep 0.3
      line=$(ucx_perftest 127.0.0.1 -t "$test" -s "$bytes" -n "$iters" -p "$port" -f 2>&1 | grep -E '^\s+[0-9]+' | tail -1 || true)
      wait
      # Columns: iterations, overhead 50%ile / average / overall (us), bandwidth average /
      # overall (MB/s = 2^20 B/s), message rate average / overall.
      read -r _ _ avg_us _ mbs _ <<<"$line"
      [[ $avg_us =~ ^[0-9.]+$ && $mbs =~ ^[0-9.]+$ ]] || continue  # perftest printed inf or nothing
      echo "{\"contender\":\"ucx_perftest\",\"op\":\"$test\",\"ranks\":2,\"bytes\":$bytes,\"time_us\":${avg_us:-0},\"busbw\":$(awk -v m="${mbs:-0}" 'BEGIN{printf "%.4f", m*1048576/1e9}')}" \
        | tee -a "$out/runs.jsonl" >&2
    done
  done
done
# Dedicated 4 KB latency rounds: every contender in turn, long enough to be steady.
sizes=4K
bench_args=(--iters "$lat_iters")
tag='"phase":"latency",'
for round in $(seq 1 "$lat_rounds"); do
  for n in ${ranks_list//,/ }; do
    bench "Cortado TCP" "$n" CORTADO_TRANSPORT=tcp
    bench "Cortado UCX shm" "$n" CORTADO_TRANSPORT=ucx UCX_TLS=sm,self
    bench "Cortado UCX tcp" "$n" CORTADO_TRANSPORT=ucx UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    echo "== latency round $round, $n ranks: Open MPI" >&2
    mpirun "${mpi_flags[@]}" -np "$n" "$work/mpi_allreduce" 4096 4096 mpi "$lat_iters" \
      | grep '^{' | sed "s/^{/{\"contender\":\"Open MPI\",$tag/" | tee -a "$out/runs.jsonl" >&2
  done
done
bench_load after "$out/info.txt"

"$py" "$root/scripts/bench/ucx/summarize.py" "$out/runs.jsonl" | tee "$out/summary.md"
