#!/usr/bin/python3
"""Writes a torchvision ssd300_vgg16 with random weights and its head outputs for one input, for
tests/tools/ssd_weights_test.cpp, which runs this script at test time into a temporary folder:
the full model's weights are about 100 MB, too large to commit.

    /usr/bin/python3 tests/make_ssd_golden.py OUT_DIR [NUM_CLASSES]

Writes, in OUT_DIR:
    ssd300_vgg16.safetensors     the state_dict (torchvision's names), float32
    ssd300_vgg16.io.safetensors  "input" [1, 3, 300, 300] and the head's "cls_logits"
                                 [1, 8732, NUM_CLASSES] and "bbox_regression" [1, 8732, 4]
Built with weights=None, weights_backbone=None (nothing is downloaded) and seeded, so every run
writes the same files for a given torch; each records the torch and torchvision versions. The
head outputs are torchvision's own code: model.head(model.backbone(x)), the path SSD.forward
takes between its transform (resize and normalization, the data pipeline's job in Cortado) and
its loss or postprocessing.
"""
import json
import os
import struct
import sys

import torch
import torchvision


def save_safetensors(path, tensors, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
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


def main():
    out = sys.argv[1]
    num_classes = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(2)
    torch.manual_seed(20261206)
    model = torchvision.models.detection.ssd300_vgg16(weights=None, weights_backbone=None,
                                                      num_classes=num_classes)
    gen = torch.Generator().manual_seed(44)
    with torch.no_grad():
        # Every tensor random (torchvision zeroes the biases and sets the scale to 20), so a
        # tensor loaded into the wrong place changes the outputs: weights He-scaled to keep the
        # activations' size through the ReLUs, biases small, the L2 scales in [10, 30).
        for name, p in model.named_parameters():
            if name == "backbone.scale_weight":
                p.copy_(torch.rand(p.shape, generator=gen) * 20 + 10)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / p[0].numel()) ** 0.5)
    model.eval()
    x = torch.randn(1, 3, 300, 300, generator=gen)
    with torch.no_grad():
        features = list(model.backbone(x).values())
        head = model.head(features)
    meta = {"torch": torch.__version__, "torchvision": torchvision.__version__,
            "case": "ssd300_vgg16 num_classes=%d" % num_classes}
    save_safetensors(os.path.join(out, "ssd300_vgg16.safetensors"), model.state_dict(), meta)
    save_safetensors(os.path.join(out, "ssd300_vgg16.io.safetensors"),
                     {"input": x, "cls_logits": head["cls_logits"],
                      "bbox_regression": head["bbox_regression"]}, meta)
    print("ssd300_vgg16: %d tensors, cls_logits %s, bbox_regression %s (torch %s, torchvision %s)"
          % (len(model.state_dict()), list(head["cls_logits"].shape),
             list(head["bbox_regression"].shape), torch.__version__, torchvision.__version__))


if __name__ == "__main__":
    main()
