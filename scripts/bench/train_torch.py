#!/usr/bin/python3
"""PyTorch side of scripts/bench/train.sh: the same LeNet / ResNet-20 as Cortado's models/
builders, trained on Fashion-MNIST with the same batch size, solver and thread count.

Prints one JSON object: {"framework","model","batch","threads","iters","img_per_s","params"}.
Run with Debian's /usr/bin/python3 (python3-torch 1.13)."""
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FASHION = "/usr/share/datasets/fashion-mnist/"


class LeNet(nn.Module):
    """conv 5x5 32 pad 2, ReLU, max pool 2, conv 5x5 64 pad 2, ReLU, max pool 2, fc 512, fc."""

    def __init__(self, in_ch=1, classes=10, side=28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (side // 4) ** 2, 512)
        self.logits = nn.Linear(512, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.logits(F.relu(self.fc1(torch.flatten(x, 1))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.proj is None else self.proj(x)))


class CifarResNet(nn.Module):
    """ResNet-(6n+2): 16/32/64 channels, projection shortcuts, as models/builders.cpp."""

    def __init__(self, n=3, in_ch=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for stage, width in enumerate((16, 32, 64)):
            for b in range(n):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and b == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.logits = nn.Linear(64, classes)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.logits(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def load_fashion(limit):
    with gzip.open(FASHION + "train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:limit]
    with gzip.open(FASHION + "train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:limit]
    x = (images.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["lenet", "resnet20"], required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--count-params", action="store_true", help="print parameter counts only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = LeNet() if args.model == "lenet" else CifarResNet()
    params = sum(p.numel() for p in model.parameters())
    if args.count_params:
        print(json.dumps({"model": args.model, "params": params}))
        return
    x, y = load_fashion(args.batch * 20)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    model.train()

    def step(i):
        lo = (i * args.batch) % (x.shape[0] - args.batch + 1)
        xb, yb = x[lo:lo + args.batch], y[lo:lo + args.batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.iters):
        step(args.warmup + i)
    seconds = time.perf_counter() - t0
    print(json.dumps({"framework": "pytorch " + torch.__version__, "model": args.model,
                      "batch": args.batch, "threads": torch.get_num_threads(),
                      "iters": args.iters, "img_per_s": args.iters * args.batch / seconds,
                      "params": params}))


if __name__ == "__main__":
    main()
