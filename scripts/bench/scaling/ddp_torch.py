#!/usr/bin/python3
"""PyTorch side of scripts/bench/scaling.sh: the same models, per-rank batch, thread count and
synthetic data as the Cortado runs, trained with SGD, alone or under DistributedDataParallel
over Gloo (rank and world from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT).

ResNet-20 is scripts/bench/train_torch.py's CIFAR-style net (3 input channels, 32x32);
ResNet-50 is torchvision's, in channels-last memory format (PyTorch's fastest fp32 mode on
this CPU). DDP keeps its defaults: 25 MB buckets, all-reduce overlapped with backward.

Prints one JSON object (rank 0): {"framework","model","world","batch","threads","warmup",
"step_s": [seconds of each measured step]}. Run with Debian's /usr/bin/python3."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from train_torch import CifarResNet  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["resnet20", "resnet50"], required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)

    if args.model == "resnet50":
        model, shape, classes = torchvision.models.resnet50(), (3, 224, 224), 1000
        fmt = torch.channels_last
    else:
        model, shape, classes = CifarResNet(n=3, in_ch=3, classes=10), (3, 32, 32), 10
        fmt = torch.contiguous_format
    model = model.to(memory_format=fmt)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn((args.batch,) + shape, generator=g).to(memory_format=fmt)
    y = torch.randint(0, classes, (args.batch,), generator=g)
    net.train()

    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()  # under DDP, returns once every bucket is all-reduced
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"framework": "pytorch " + torch.__version__, "model": args.model,
                          "world": world, "batch": args.batch, "threads": torch.get_num_threads(),
                          "warmup": args.warmup, "step_s": times}))


if __name__ == "__main__":
    main()
