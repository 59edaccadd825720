#!/usr/bin/python3
"""Summarizes a scripts/bench/comm.sh run folder: per size and contender, the median bus
bandwidth over the rounds with [min, max] (time in microseconds: the median), the ratios of
Cortado's median to each peer's and to the TCP baseline's, and the two goals. Prints markdown.

    scripts/bench/comm/summarize.py runs/bench-comm-<time>
"""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
NAMES = {"cortado": "Cortado", "gloo": "Gloo", "mpi_tcp": "Open MPI tcp",
         "mpi_shm": "Open MPI shm", "baseline": "TCP baseline"}


def load(name):
    """{bytes: [record per round]}"""
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, name + ".*.jsonl"))):
        for line in open(path):
            if line.startswith("{"):
                d = json.loads(line)
                rows.setdefault(d["bytes"], []).append(d)
    return rows


runs = {k: load(k) for k in NAMES}
rounds = len(glob.glob(os.path.join(out, "cortado.*.jsonl")))


def med(k, b, field="busbw"):
    rows = runs[k].get(b)
    return statistics.median(r[field] for r in rows) if rows else None


def cell(k, b):
    rows = runs[k].get(b)
    if not rows:
        return "-"
    bus = [r["busbw"] for r in rows]
    return (f"{statistics.median(bus):.3f} [{min(bus):.3f}, {max(bus):.3f}] "
            f"({statistics.median(r['time_us'] for r in rows):.1f})")


def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def ratio(a, c):
    return f"{a / c:.2f}x" if a and c else "-"


sizes = sorted(runs["cortado"])
print(f"All-reduce, 2 ranks, f32 sum: bus bandwidth GB/s, median of {rounds} round(s) "
      "[min, max] (median time, us)\n")
print("| bytes | Cortado | Gloo | Open MPI tcp | Open MPI shm | TCP baseline | vs Gloo | "
      "vs MPI tcp | vs MPI shm | vs baseline |")
print("|---|---|---|---|---|---|---|---|---|---|")
for b in sizes:
    algo = runs["cortado"][b][0].get("algo", "")
    c = med("cortado", b)
    print(f"| {human(b)} ({algo}) | " + " | ".join(cell(k, b) for k in NAMES) + " | " +
          " | ".join(ratio(c, med(k, b)) for k in ("gloo", "mpi_tcp", "mpi_shm", "baseline")) +
          " |")
print()
big = [b for b in sizes if 64 << 20 <= b <= 128 << 20 and b in runs["baseline"]]
if big:
    c = statistics.mean(med("cortado", b) for b in big)
    base = statistics.mean(med("baseline", b) for b in big)
    print(f"Goal 1, 64-128 MB: Cortado busbw {c:.3f} GB/s = {100 * c / base:.1f}% of the "
          f"same-shape TCP baseline ({base:.3f} GB/s; goal >= 85%)", end="")
    for k in ("gloo", "mpi_tcp", "mpi_shm"):
        vals = [med(k, b) for b in big if b in runs[k]]
        if vals:
            print(f"; {c / statistics.mean(vals):.2f}x {NAMES[k]}", end="")
    print()
small = sizes[0] if sizes else None
if small is not None and small in runs["mpi_tcp"]:
    ct, mt = med("cortado", small, "time_us"), med("mpi_tcp", small, "time_us")
    print(f"Goal 2, {human(small)} latency: Cortado {ct:.1f} us, Open MPI tcp {mt:.1f} us "
          f"({'met' if ct <= mt else 'missed'}: {mt / ct:.2f}x)")
print(f"\nRaw results: {out}")
