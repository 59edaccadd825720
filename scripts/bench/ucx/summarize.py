#!/usr/bin/env python3
"""Tables for scripts/bench/ucx.sh: busbw GB/s, median of the rounds [min, max], per rank count
and size, one column per contender; then the 4 KB latency (median time_us [min, max]; from the
dedicated latency rounds where the run has them) and the ratios the issue sets as goals (UCX vs
Cortado TCP and vs Open MPI at 64 MB, 2 ranks; UCX's 4 KB latency vs Open MPI's)."""
import json
import statistics
import sys
from collections import defaultdict

ORDER = ["Cortado TCP", "Cortado UCX shm", "Cortado UCX shm ring", "Cortado UCX tcp", "Open MPI",
         "Gloo", "ucx_perftest"]


def size_name(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def cell(values):
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(path):
    bw = defaultdict(list)   # (ranks, bytes, contender) -> busbw per round
    lat = defaultdict(list)  # (ranks, bytes, contender) -> time_us per round
    cpu = defaultdict(list)  # (ranks, bytes, contender) -> rank 0's CPU time / wall time
    lat_rounds = defaultdict(list)  # (ranks, contender) -> time_us of each dedicated 4 KB round
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError:  # e.g. a perftest figure it printed as "inf": skipped
            continue
        who, op = j["contender"], j.get("op", "allreduce")
        if j.get("phase") == "latency":
            lat_rounds[(j["ranks"], who)].append(j["time_us"])
            continue
        if who == "ucx_perftest":
            key = (2, j["bytes"], who)
            (bw if op == "tag_bw" else lat)[key].append(j["busbw"] if op == "tag_bw" else j["time_us"])
            continue
        key = (j["ranks"], j["bytes"], who)
        bw[key].append(j["busbw"])
        lat[key].append(j["time_us"])
        if "cpu_us" in j and j["time_us"] > 0:
            cpu[key].append(j["cpu_us"] / j["time_us"])
    ranks = sorted({k[0] for k in bw})
    sizes = sorted({k[1] for k in bw})
    for n in ranks:
        cols = [c for c in ORDER if any(k[0] == n and k[2] == c for k in bw)]
        print(f"\n### {n} ranks: bus bandwidth GB/s, median [min, max]"
              + (" (ucx_perftest: tag_bw between 2 processes)" if "ucx_perftest" in cols else ""))
        print("| bytes | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        for s in sizes:
            print(f"| {size_name(s)} | " + " | ".join(cell(bw.get((n, s, c), [])) for c in cols) + " |")
        s = sizes[0]
        print(f"\n{size_name(s)} latency, {n} ranks, sweep rounds (time_us, median [min, max]; "
              "ucx_perftest: tag_lat one-way): " + "; ".join(
                  f"{c} {cell(lat.get((n, s, c), []))}" for c in cols if lat.get((n, s, c))))
        if any(k[0] == n for k in lat_rounds):
            k = len(next(v for key, v in lat_rounds.items() if key[0] == n))
            print(f"\n4K latency, {n} ranks, {k} dedicated rounds (time_us, median [min, max]): "
                  + "; ".join(f"{c} {cell(lat_rounds[(n, c)])}" for c in ORDER
                              if lat_rounds.get((n, c))))
    print("\nCPU cost of progress: rank 0's process CPU time / wall time during the timed "
          "iterations (1.0 = one core busy), median [min, max]:")
    for n in ranks:
        for s in (sizes[0], sizes[-1]):
            parts = [f"{c} {cell(cpu[(n, s, c)])}" for c in ORDER if cpu.get((n, s, c))]
            if parts:
                print(f"- {n} ranks, {size_name(s)}: " + "; ".join(parts))
    med = lambda k: statistics.median(bw[k]) if bw.get(k) else None
    s64 = 64 << 20
    for ucx in ("Cortado UCX shm", "Cortado UCX shm ring", "Cortado UCX tcp"):
        u, t, m = med((2, s64, ucx)), med((2, s64, "Cortado TCP")), med((2, s64, "Open MPI"))
        if u and t and m:
            print(f"\n64M, 2 ranks: {ucx} {u:.3f} GB/s = {u / t:.2f}x Cortado TCP ({t:.3f}), "
                  f"{u / m:.2f}x Open MPI ({m:.3f})")
    for n in ranks:
        u, m = lat_rounds.get((n, "Cortado UCX shm")), lat_rounds.get((n, "Open MPI"))
        if u and m:
            um, mm = statistics.median(u), statistics.median(m)
            print(f"\n4K latency, {n} ranks: Cortado UCX shm {um:.3f} us vs Open MPI {mm:.3f} us "
                  f"({'below' if um < mm else 'not below'}; ratio {um / mm:.2f})")


if __name__ == "__main__":
    main(sys.argv[1])
