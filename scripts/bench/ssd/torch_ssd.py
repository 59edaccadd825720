#!/usr/bin/python3
"""The PyTorch side of scripts/bench/ssd.sh: torchvision's ssd300_vgg16 (random weights, no
download), one mode, one process.

  torch_ssd.py --mode nchw|channels_last --batch 8 --classes 11 --threads 2 --iters 2 --warmup 1

Prints one JSON object: img_per_s of training steps (the model's own transform to 300x300,
forward with targets, the sum of its box and class losses, backward, SGD with momentum) and
peak_rss_mb. Images are random 300x300 tensors with one to four random boxes each, made before
the timed steps (Cortado's side reads and augments its LMDB inside the step).
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
    ap.add_argument("--mode", choices=["nchw", "channels_last"], default="nchw")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--classes", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torchvision.models.detection.ssd300_vgg16(
        weights=None, weights_backbone=None, num_classes=args.classes)
    if args.mode == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    model.train()
    images = [torch.rand(3, 300, 300) for _ in range(args.batch)]
    targets = []
    for _ in range(args.batch):
        n = int(torch.randint(1, 5, ()))
        xy = torch.rand(n, 2) * 200
        wh = 30 + torch.rand(n, 2) * 70
        targets.append({"boxes": torch.cat([xy, xy + wh], 1),
                        "labels": torch.randint(1, args.classes, (n,))})
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        losses = model(images, targets)
        loss = sum(losses.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    seconds = time.perf_counter() - t0
    print(json.dumps({"model": "ssd300_vgg16", "mode": args.mode,
                      "img_per_s": args.iters * args.batch / seconds,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
