#!/usr/bin/python3
"""Writes tests/testdata/torchvision/: torchvision models with random weights, as safetensors,
and the logits PyTorch computes from them, for tests/tools/weights_test.cpp (no torch needed
there).

Run with Debian's python3 (the one that sees python3-torch and python3-torchvision):
    /usr/bin/python3 tests/make_torchvision_golden.py
Regenerate only when a case changes; every file records the torch version that wrote it.

For each case NAME:
    NAME.safetensors      the model's state_dict (torchvision's names), float32
    NAME.io.safetensors   "input" [2, 3, S, S] and "logits" [2, classes] in eval mode
    NAME.keys.txt         (full-size models) "name shape" per state_dict entry, to check the
                          names and shapes of the published architecture without its weights
    ssd300_priors.safetensors  "priors" [8732, 4]: ssd300_vgg16's default boxes, float32

Full-width ResNet-18 weights (47 MB) are too large to commit, so the logits cases use
torchvision's ResNet class and blocks at a reduced width (8 channels in the first stage instead
of 64; Cortado's model.base_width), with every weight and batch-norm statistic random.
"""
import json
import os
import struct

import torch
import torch.nn as nn
import torchvision
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "torchvision")


class NarrowResNet(ResNet):
    """torchvision's ResNet with the first stage `width` channels wide (64 as published)."""

    def __init__(self, block, layers, width, num_classes):
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * block.expansion, num_classes)


def save_safetensors(path, tensors, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)


def randomize(model, gen):
    """Every parameter and BN statistic random, so a misplaced tensor changes the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bn1.weight") or ".bn" in name or "downsample.1" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)  # BN scale in [0.5, 1.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / max(1, p[0].numel())) ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
            elif name.endswith("num_batches_tracked"):
                b.fill_(7)


def write_case(name, model, side, gen):
    randomize(model, gen)
    model.eval()
    x = torch.randn(2, 3, side, side, generator=gen)
    with torch.no_grad():
        logits = model(x)
    meta = {"torch": torch.__version__, "torchvision": torchvision.__version__, "case": name}
    save_safetensors(os.path.join(OUT, name + ".safetensors"), model.state_dict(), meta)
    save_safetensors(os.path.join(OUT, name + ".io.safetensors"),
                     {"input": x, "logits": logits}, meta)
    print("%s: %d tensors, logits %s" % (name, len(model.state_dict()), list(logits.shape)))


def write_keys(name, model):
    with open(os.path.join(OUT, name + ".keys.txt"), "w") as f:
        f.write("# %s state_dict of torchvision %s: name shape\n" % (name, torchvision.__version__))
        for k, v in model.state_dict().items():
            f.write("%s %s\n" % (k, "x".join(str(d) for d in v.shape) or "scalar"))
    print("%s: %d keys" % (name, len(model.state_dict())))


def write_ssd_priors(model):
    """ssd300_vgg16's 8732 default boxes as torchvision makes them (float32, (cx, cy, w, h)
    normalized), from the grid sizes of its backbone at 300x300."""
    model.eval()
    with torch.no_grad():
        features = list(model.backbone(torch.zeros(1, 3, 300, 300)).values())
    grid = [list(f.shape[-2:]) for f in features]
    priors = model.anchor_generator._grid_default_boxes(grid, [300, 300], dtype=torch.float32)
    meta = {"torch": torch.__version__, "torchvision": torchvision.__version__,
            "case": "ssd300_vgg16 DefaultBoxGenerator", "grid": json.dumps(grid)}
    save_safetensors(os.path.join(OUT, "ssd300_priors.safetensors"), {"priors": priors}, meta)
    print("ssd300_priors: %s from grids %s" % (list(priors.shape), grid))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20261202)
    write_case("resnet18_w8", NarrowResNet(BasicBlock, [2, 2, 2, 2], 8, 10), 64, gen)
    write_case("resnet50_w8", NarrowResNet(Bottleneck, [3, 4, 6, 3], 8, 10), 64, gen)
    write_keys("resnet18", torchvision.models.resnet18())
    write_keys("resnet50", torchvision.models.resnet50())
    write_keys("vgg16_bn", torchvision.models.vgg16_bn())
    ssd = torchvision.models.detection.ssd300_vgg16(weights=None, weights_backbone=None,
                                                   num_classes=21)
    write_keys("ssd300_vgg16", ssd)
    write_ssd_priors(ssd)


if __name__ == "__main__":
    main()
