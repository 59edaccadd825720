#!/usr/bin/env bash
# Side-by-side all-reduce benchmark, 2 ranks on this machine, f32 sum, same sizes for everyone:
#   Cortado over TCP   cortado launch --nproc 2 -- cortado bench comm --json
#   Gloo               torch.distributed (Debian's python3-torch), scripts/bench/comm/gloo_allreduce.py
#   Open MPI tcp       MPI_Allreduce over the tcp BTL (loopback), scripts/bench/comm/mpi_allreduce.c
#   Open MPI shm       MPI_Allreduce over the shared-memory BTL (vader, or sm on Open MPI 5)
#   TCP baseline       the same shape without the collective: 2 processes on one loopback TCP
#                      connection, each sending and receiving `size` bytes at once from one
#                      thread with 4 MiB writes (scripts/bench/comm/duplex_baseline.c); a 2-rank
#                      ring all-reduce moves exactly that, so its rate bounds the busbw
# Bus bandwidth follows nccl-tests (all-reduce busbw = algbw x 2(n-1)/n; GB/s = 1e9 B/s). All of
# it runs --rounds times in turn; every cell is the median over the rounds with [min, max], and
# ratios are of the medians. Raw JSON lines go to runs/bench-comm-<time>/.
#
#   scripts/bench/comm.sh [--sizes 4K:128M] [--build DIR] [--rounds 3]
# Needs: cmake and a C++ toolchain (it builds `cortado` in DIR, default build/), mpicc/mpirun,
# and /usr/bin/python3 with torch (scripts/setup.sh --bench installs them).
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

sizes=4K:128M
rounds=3
while (($#)); do
  bench_option 2,18 "$@"
  shift "$bench_shift"
done

bench_sizes "$sizes"
bench_need mpicc mpirun cc "$py"
"$py" -c 'import torch.distributed' 2>/dev/null ||
  { echo "comm.sh: $py cannot import torch; run scripts/setup.sh --bench" >&2; exit 1; }

# The cortado binary, built (incrementally) in --build DIR, default build/.
bench_cortado --build

bench_out comm
bench_scratch

mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)
shm_btl=vader
ompi_info 2>/dev/null | grep -q "btl: vader" || shm_btl=sm

{
  bench_machine
  echo "# cortado: $cortado; $(mpirun --version 2>&1 | head -1); torch $("$py" -c 'import torch; print(torch.__version__)')"
} | tee -a "$out/info.txt"
bench_load before "$out/info.txt"

bench_mpi_build

cc -O2 -o "$work/duplex_baseline" "$root/scripts/bench/comm/duplex_baseline.c"

# Everything runs --rounds times in turn (default 3), interleaved, and each cell is the median of
# the rounds, so neither a burst of load nor a lucky round decides the result.
for round in $(seq 1 "$rounds"); do
  echo "== round $round: Cortado over TCP" >&2
  "$cortado" launch --nproc 2 --no-prefix -- "$cortado" bench comm --sizes "$sizes" --json \
    | grep '^{' | tee "$out/cortado.$round.jsonl" >&2

  echo "== round $round: Gloo (torch.distributed)" >&2
  bench_gloo 2
  grep '^{' "$work/gloo.0" | tee "$out/gloo.$round.jsonl" >&2

  echo "== round $round: Open MPI tcp and shared memory (mpicc MPI_Allreduce)" >&2
  "${mpi[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo "$work/mpi_allreduce" "$lo" "$hi" mpi_tcp \
    | grep '^{' | tee "$out/mpi_tcp.$round.jsonl" >&2
  "${mpi[@]}" --mca btl "$shm_btl,self" "$work/mpi_allreduce" "$lo" "$hi" mpi_shm \
    | grep '^{' | tee "$out/mpi_shm.$round.jsonl" >&2

  echo "== round $round: TCP baseline, one loopback connection, both directions at once" >&2
  "$work/duplex_baseline" "$lo" "$hi" | tee "$out/baseline.$round.jsonl" >&2
done
bench_load after "$out/info.txt"

"$py" "$root/scripts/bench/comm/summarize.py" "$out" | tee "$out/summary.txt"
