#!/usr/bin/python3
"""The PyTorch side of scripts/bench/models.sh: one torchvision model, one mode, one process.

  torch_models.py --model resnet50 --mode nchw|channels_last|bf16 --batch 16 --threads 2
                  --iters 3 --warmup 1 [--infer]

Prints one JSON object: img_per_s (training steps: forward, cross-entropy, backward, SGD with
momentum; or with --infer, forward passes in eval mode under no_grad) and peak_rss_mb (the
process's peak resident memory, as Cortado's bench reports it). bf16 is
torch.autocast("cpu", dtype=torch.bfloat16) on channels-last, PyTorch's fastest CPU mode.
Run with Debian's /usr/bin/python3 (python3-torch, python3-torchvision).
"""
import argparse
import json
import resource
import time

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["nchw", "channels_last", "bf16"], default="nchw")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--infer", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=1000)
    x = torch.randn(args.batch, 3, 224, 224)
    y = torch.randint(0, 1000, (args.batch,))
    if args.mode != "nchw":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.mode == "bf16"):
            if args.infer:
                with torch.no_grad():
                    model(x)
                return
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    model.eval() if args.infer else model.train()
    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    seconds = time.perf_counter() - t0
    print(json.dumps({"model": args.model, "mode": args.mode, "infer": args.infer,
                      "img_per_s": args.iters * args.batch / seconds,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
