#!/usr/bin/python3
"""PyTorch counterpart of layer_bench.cpp: the fastest of R forward and backward passes of the
same ops on the same shapes (batch 128), for a per-layer speed ratio.
    /usr/bin/python3 scripts/experiments/layer_bench.py [threads=2] [reps=20]"""
import sys
import time

import torch
import torch.nn as nn

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
torch.set_num_threads(threads)
torch.manual_seed(0)

cases = [
    ("lenet.conv1 1->32 5x5 28x28", nn.Conv2d(1, 32, 5, padding=2), (128, 1, 28, 28), False),
    ("lenet.conv2 32->64 5x5 14x14", nn.Conv2d(32, 64, 5, padding=2), (128, 32, 14, 14), True),
    ("lenet.pool1 2x2 32x28x28", nn.MaxPool2d(2, 2), (128, 32, 28, 28), True),
    ("lenet.relu1 32x28x28", nn.ReLU(), (128, 32, 28, 28), True),
    ("lenet.fc1 3136->512", nn.Sequential(nn.Flatten(), nn.Linear(3136, 512)), (128, 64, 7, 7), True),
    ("r20.conv 16->16 3x3 28x28", nn.Conv2d(16, 16, 3, 1, 1, bias=False), (128, 16, 28, 28), True),
    ("r20.conv 16->32 3x3 s2", nn.Conv2d(16, 32, 3, 2, 1, bias=False), (128, 16, 28, 28), True),
    ("r20.conv 32->32 3x3 14x14", nn.Conv2d(32, 32, 3, 1, 1, bias=False), (128, 32, 14, 14), True),
    ("r20.conv 64->64 3x3 7x7", nn.Conv2d(64, 64, 3, 1, 1, bias=False), (128, 64, 7, 7), True),
    ("r20.proj 16->32 1x1 s2", nn.Conv2d(16, 32, 1, 2, 0, bias=False), (128, 16, 28, 28), True),
    ("r20.bn 16x28x28", nn.BatchNorm2d(16), (128, 16, 28, 28), True),
    ("r20.bn 64x7x7", nn.BatchNorm2d(64), (128, 64, 7, 7), True),
    ("r20.relu 16x28x28", nn.ReLU(), (128, 16, 28, 28), True),
    ("r20.gap 64x7x7", nn.AdaptiveAvgPool2d(1), (128, 64, 7, 7), True),
]
print("threads %d, fastest of %d (torch %s)" % (threads, reps, torch.__version__))
print("%-32s %10s %10s" % ("layer", "fwd ms", "bwd ms"))
for label, mod, shape, grad_input in cases:
    x = torch.randn(*shape, requires_grad=grad_input)
    fwd = bwd = 1e30
    for r in range(reps + 2):
        t0 = time.perf_counter()
        y = mod(x)
        t1 = time.perf_counter()
        y.backward(torch.randn_like(y))
        t2 = time.perf_counter()
        if r >= 2:
            fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
    print("%-32s %10.3f %10.3f" % (label, 1e3 * fwd, 1e3 * bwd))
