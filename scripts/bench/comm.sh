#!/usr/bin/env bash
# Side-by-side all-reduce benchmark, 2 ranks on this machine, f32 sum, same sizes for everyone:
#   Cortado over TCP   cortado launch --nproc 2 -- cortado bench comm --json
#   Gloo               torch.distributed (Debian's python3-torch), scripts/bench/comm/gloo_allreduce.py
#   Open MPI tcp       MPI_Allreduce over the tcp BTL (loopback), scripts/bench/comm/mpi_allreduce.c
#   Open MPI shm       MPI_Allreduce over the shared-memory BTL (vader, or sm on Open MPI 5)
#   TCP ceiling        two concurrent iperf3 loopback streams in opposite directions (one client
#                      and one server process per direction); the per-direction rate bounds a
#                      2-rank ring all-reduce's bus bandwidth
# Bus bandwidth follows nccl-tests (all-reduce busbw = algbw x 2(n-1)/n; GB/s = 1e9 B/s). Every
# figure is printed, then the ratios. Raw JSON lines go to runs/bench-comm-<time>/. All of it
# runs --rounds times in turn and each contender keeps its best time per size.
#
#   scripts/bench/comm.sh [--sizes 4K:128M] [--build DIR] [--iperf-seconds 5] [--rounds 2]
# Needs: cmake and a C++ toolchain (it builds `cortado` in DIR, default build/), mpicc/mpirun,
# iperf3 and /usr/bin/python3 with torch (scripts/setup.sh --bench installs them).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
sizes=4K:128M
build=""
iperf_seconds=5
rounds=2
while (($#)); do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --iperf-seconds) iperf_seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "comm.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

to_bytes() {  # 4K -> 4096 (K = 1024)
  local v=${1^^}
  case "$v" in
    *G) echo $(( ${v%G} << 30 )) ;;
    *M) echo $(( ${v%M} << 20 )) ;;
    *K) echo $(( ${v%K} << 10 )) ;;
    *) echo "$v" ;;
  esac
}
lo=$(to_bytes "${sizes%%:*}")
hi=$(to_bytes "${sizes##*:}")

for tool in mpicc mpirun iperf3 /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "comm.sh: '$tool' not found; run scripts/setup.sh --bench" >&2; exit 1; }
done
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  { echo "comm.sh: /usr/bin/python3 cannot import torch; run scripts/setup.sh --bench" >&2; exit 1; }

# The cortado binary: built (incrementally) in --build DIR, default build/, so the figures are
# for the current source. If that build fails, an existing binary there is used, with a warning.
build=${build:-$root/build}
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
echo "comm.sh: building cortado in $build" >&2
if ! cmake --build "$build" -j "$(nproc)" --target cortado >"$build/comm-bench-build.log" 2>&1; then
  echo "comm.sh: warning: building cortado failed (see $build/comm-bench-build.log)" >&2
fi
cortado="$build/tools/cortado"
if ! [[ -x "$cortado" ]] || ! "$cortado" bench comm --help >/dev/null 2>&1; then
  echo "comm.sh: no usable $cortado" >&2
  exit 1
fi

out="$root/runs/bench-comm-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)
shm_btl=vader
ompi_info 2>/dev/null | grep -q "btl: vader" || shm_btl=sm

{
  echo "# $(date -Is) $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# cortado: $cortado; $(mpirun --version 2>&1 | head -1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); $(iperf3 --version | head -1)"
} | tee "$out/info.txt"

mpicc -O2 -o "$work/mpi_allreduce" "$root/scripts/bench/comm/mpi_allreduce.c"

# iperf3's default 128 KiB writes define the ceiling; 1 MiB writes (its maximum) are measured too,
# since the per-direction rate depends on the write size.
iperf_pair() {  # $1: file label, $2...: extra iperf3 client options
  local label=$1; shift
  local p1 p2
  p1=$(free_port); p2=$(free_port)
  iperf3 -s -1 -p "$p1" >/dev/null 2>&1 &
  iperf3 -s -1 -p "$p2" >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$p1" -t "$iperf_seconds" "$@" -J > "$out/${label}_forward.json" &
  iperf3 -c 127.0.0.1 -p "$p2" -t "$iperf_seconds" -R "$@" -J > "$out/${label}_reverse.json"
  wait
}

# Everything runs --rounds times in turn (default 2) and each contender keeps its best figure per
# size, so a burst of load from another process on a shared machine does not decide the result.
for round in $(seq 1 "$rounds"); do
  echo "== round $round: Cortado over TCP" >&2
  "$cortado" launch --nproc 2 --no-prefix -- "$cortado" bench comm --sizes "$sizes" --json \
    | grep '^{' | tee "$out/cortado.$round.jsonl" >&2

  echo "== round $round: Gloo (torch.distributed)" >&2
  port=$(free_port)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      /usr/bin/python3 "$root/scripts/bench/comm/gloo_allreduce.py" "$lo" "$hi" > "$work/gloo.$r" &
  done
  wait
  grep '^{' "$work/gloo.0" | tee "$out/gloo.$round.jsonl" >&2

  echo "== round $round: Open MPI tcp and shared memory (mpicc MPI_Allreduce)" >&2
  "${mpi[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo "$work/mpi_allreduce" "$lo" "$hi" mpi_tcp \
    | grep '^{' | tee "$out/mpi_tcp.$round.jsonl" >&2
  "${mpi[@]}" --mca btl "$shm_btl,self" "$work/mpi_allreduce" "$lo" "$hi" mpi_shm \
    | grep '^{' | tee "$out/mpi_shm.$round.jsonl" >&2

  echo "== round $round: TCP ceiling, iperf3, two loopback streams in opposite directions" >&2
  iperf_pair "iperf_default.$round"
  iperf_pair "iperf_1m.$round" -l 1M
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/info.txt"

/usr/bin/python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
import glob
def load(name):
    # Best (fastest) figure per size over the rounds.
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, name + ".*.jsonl"))):
        for line in open(path):
            d = json.loads(line)
            if d["bytes"] not in rows or d["time_us"] < rows[d["bytes"]]["time_us"]:
                rows[d["bytes"]] = d
    return rows
runs = {k: load(k) for k in ("cortado", "gloo", "mpi_tcp", "mpi_shm")}
def iperf(label):
    best = None
    for path in sorted(glob.glob(os.path.join(out, f"{label}.*_forward.json"))):
        rates = []
        for way in ("forward", "reverse"):
            d = json.load(open(path.replace("_forward", "_" + way)))
            rates.append(d["end"]["sum_received"]["bits_per_second"] / 8e9)
        if best is None or sum(rates) > sum(best):
            best = rates
    return best
rates, rates_1m = iperf("iperf_default"), iperf("iperf_1m")
ceiling, ceiling_1m = sum(rates) / 2, sum(rates_1m) / 2
def fmt(v, w=9, p=3):
    return f"{v:{w}.{p}f}" if v is not None else " " * (w - 1) + "-"
sizes = sorted(set().union(*[r.keys() for r in runs.values()]))
def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)
print()
print(f"TCP ceiling (iperf3, 2 opposite loopback streams, default 128 KiB writes): {rates[0]:.3f} and "
      f"{rates[1]:.3f} GB/s per direction, mean {ceiling:.3f} GB/s")
print(f"  with 1 MiB writes (iperf3 -l 1M): {rates_1m[0]:.3f} and {rates_1m[1]:.3f} GB/s, "
      f"mean {ceiling_1m:.3f} GB/s")
print()
print("All-reduce, 2 ranks, f32 sum: bus bandwidth in GB/s (time in microseconds in brackets)")
hdr = f"{'bytes':>6} {'algo':>17} {'cortado':>19} {'gloo':>19} {'mpi tcp':>19} {'mpi shm':>19}   {'c/gloo':>6} {'c/mpitcp':>8} {'c/mpishm':>8} {'c/ceil':>6}"
print(hdr)
for b in sizes:
    cells, bus = [], {}
    for k in ("cortado", "gloo", "mpi_tcp", "mpi_shm"):
        d = runs[k].get(b)
        bus[k] = d["busbw"] if d else None
        cells.append(f"{fmt(bus[k], 7)} ({fmt(d['time_us'], 9, 1) if d else '        -'})")
    def ratio(a, c, w):
        return f"{a / c:{w}.2f}" if a and c else " " * (w - 1) + "-"
    algo = runs["cortado"].get(b, {}).get("algo", "-")
    print(f"{human(b):>6} {algo:>17} " + " ".join(f"{c:>19}" for c in cells) + "   " +
          ratio(bus["cortado"], bus["gloo"], 6) + " " + ratio(bus["cortado"], bus["mpi_tcp"], 8) + " " +
          ratio(bus["cortado"], bus["mpi_shm"], 8) + " " + ratio(bus["cortado"], ceiling, 6))
print()
big = [b for b in sizes if 64 << 20 <= b <= 128 << 20 and b in runs["cortado"]]
if big:
    c = sum(runs["cortado"][b]["busbw"] for b in big) / len(big)
    print(f"Goal 1, 64-128 MB: Cortado busbw {c:.3f} GB/s = {100 * c / ceiling:.1f}% of the TCP ceiling "
          f"(goal >= 85%; {100 * c / ceiling_1m:.1f}% of the 1 MiB-write figure)", end="")
    for k, name in (("gloo", "Gloo"), ("mpi_tcp", "Open MPI tcp"), ("mpi_shm", "Open MPI shm")):
        vals = [runs[k][b]["busbw"] for b in big if b in runs[k]]
        if vals:
            print(f"; {c / (sum(vals) / len(vals)):.2f}x {name}", end="")
    print()
small = min(sizes) if sizes else None
if small and small in runs["cortado"] and small in runs["mpi_tcp"]:
    ct, mt = runs["cortado"][small]["time_us"], runs["mpi_tcp"][small]["time_us"]
    print(f"Goal 2, {human(small)} latency: Cortado {ct:.1f} us, Open MPI tcp {mt:.1f} us "
          f"({'met' if ct <= mt else 'missed'}: {mt / ct:.2f}x), Gloo "
          f"{runs['gloo'].get(small, {}).get('time_us', float('nan')):.1f} us, Open MPI shm "
          f"{runs['mpi_shm'].get(small, {}).get('time_us', float('nan')):.1f} us")
rounds = len(glob.glob(os.path.join(out, "cortado.*.jsonl")))
print(f"Best of {rounds} round(s) per contender and size. Raw results: {out}")
PY
