#!/usr/bin/python3
"""Gloo all-reduce (torch.distributed) on f32 tensors, printed like `cortado bench comm --json`.

Run under scripts/bench/comm.sh, which starts one process per rank with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set:
    /usr/bin/python3 gloo_allreduce.py MIN_BYTES MAX_BYTES
Uses Debian's python3-torch (hence /usr/bin/python3) with one compute thread per process, so
the comparison with Cortado (one thread per rank) is like for like on a small machine.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def iters_for(nbytes):
    # Same schedule as cortado bench comm and the MPI program: about 256 MB moved per size.
    return max(5, min(1000, (256 << 20) // max(nbytes, 1)))


def main():
    torch.set_num_threads(1)
    lo = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    hi = int(sys.argv[2]) if len(sys.argv) > 2 else 128 << 20
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank, size = dist.get_rank(), dist.get_world_size()
    buf = torch.arange(hi // 4, dtype=torch.float32).remainder_(7)
    nbytes = lo
    while nbytes <= hi:
        t = buf[: nbytes // 4]
        iters = iters_for(nbytes)
        # Warm up for iters/10 + 2 runs and at least 100 ms (rank 0 decides), like cortado.
        w0 = time.perf_counter()
        for _ in range(iters // 10 + 2):
            dist.all_reduce(t)
        while True:
            more = torch.tensor([1.0 if time.perf_counter() - w0 < 0.1 else 0.0])
            dist.broadcast(more, 0)
            if more.item() == 0.0:
                break
            for _ in range(10):
                dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        worst = dt.item()
        if rank == 0:
            algbw = nbytes / worst / 1e9
            print(json.dumps({"op": "allreduce", "algo": "gloo", "ranks": size, "bytes": nbytes,
                              "time_us": round(worst * 1e6, 2), "algbw": round(algbw, 4),
                              "busbw": round(algbw * 2 * (size - 1) / size, 4)}), flush=True)
        nbytes *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
