#!/usr/bin/python3
"""A miniature detection set from Fashion-MNIST items, in Pascal VOC's layout.

Each image is a SIZE x SIZE canvas (default 128) of dark, smooth, noisy background holding 1 to
4 Fashion-MNIST items, each scaled to a random side (24..72 pixels by default), tinted a random
bright colour and placed at a random position inside the canvas, where its box and any earlier
item's overlap by at most 30% of the smaller of the two (so no item is mostly hidden; an item
that finds no such place in 30 tries is left out). Every item's box is tight around its pixels (those whose alpha,
the item's grey level, is at least 0.2 after scaling). Training images take items from
Fashion-MNIST's 60,000 training images, test images from its 10,000 test images.

Written as Pascal VOC is laid out, so `cortado convert` reads it as it reads VOC:

  OUT/JPEGImages/<id>.jpg            JPEG, quality 90
  OUT/Annotations/<id>.xml           <object><name> (Fashion-MNIST's class names),
                                     <bndbox> 1-based with the last pixel included, <difficult>0
  OUT/ImageSets/Main/trainval.txt    the training ids
  OUT/ImageSets/Main/test.txt        the test ids

The same --seed writes the same files. Needs numpy and PIL (python3-numpy, python3-pil) and
Debian's dataset-fashion-mnist (scripts/setup.sh installs it).

  scripts/experiments/make_fashion_detection.py [--out data-cache/fashion_detection]
      [--train 4000] [--test 800] [--size 128] [--min-side 24] [--max-side 72] [--seed 0]
  build/tools/cortado convert --root OUT --split trainval --out OUT/trainval_lmdb
  build/tools/cortado convert --root OUT --split test --out OUT/test_lmdb \\
      --label-map OUT/trainval_lmdb/labelmap.prototxt
"""
import argparse
import gzip
import os
import sys

import numpy as np
from PIL import Image

FASHION = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
ALPHA_MIN = 0.2  # an item pixel at least this opaque is inside the item's box
MAX_OVERLAP = 0.3  # intersection / the smaller box's area, between any two items' boxes
PLACE_TRIES = 30


def read_idx(path, images):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if images:
        n, rows, cols = (int.from_bytes(data[i:i + 4], "big") for i in (4, 8, 12))
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, rows, cols)
    n = int.from_bytes(data[4:8], "big")
    return np.frombuffer(data, np.uint8, offset=8, count=n)


def overlap(a, b):
    """Intersection over the smaller box's area."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    return iw * ih / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


def background(rng, size):
    """Dark, smooth colour gradients with fine noise: something to tell items from."""
    coarse = rng.uniform(0, 60, (4, 4, 3)).astype(np.float32)
    smooth = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((size, size),
                                                                       Image.BICUBIC), np.float32)
    return np.clip(smooth + rng.normal(0, 6, (size, size, 3)), 0, 255)


def make_image(rng, items, labels, args):
    """One canvas and its objects [(class, x0, y0, x1, y1)], x1/y1 exclusive."""
    canvas = background(rng, args.size)
    objects = []
    for _ in range(rng.integers(args.min_items, args.max_items + 1)):
        k = int(rng.integers(len(items)))
        side = int(rng.integers(args.min_side, args.max_side + 1))
        alpha = np.asarray(Image.fromarray(items[k]).resize((side, side), Image.BILINEAR),
                           np.float32) / 255
        ys, xs = np.nonzero(alpha >= ALPHA_MIN)
        if len(xs) == 0:
            continue
        # Where the item's own box lies inside its side x side square.
        bx0, by0, bx1, by1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
        for _ in range(PLACE_TRIES):
            # The box inside the canvas; the square may reach past its edges.
            x = int(rng.integers(-bx0, args.size - bx1 + 1))
            y = int(rng.integers(-by0, args.size - by1 + 1))
            box = (x + bx0, y + by0, x + bx1, y + by1)
            if all(overlap(box, o[1:]) <= MAX_OVERLAP for o in objects):
                break
        else:
            continue
        colour = rng.uniform(120, 255, 3).astype(np.float32)
        colour[rng.integers(3)] = 255  # bright in at least one channel
        # Paste the part of the square that lies on the canvas, blended by the item's alpha.
        cx0, cy0 = max(0, x), max(0, y)
        cx1, cy1 = min(args.size, x + side), min(args.size, y + side)
        a = alpha[cy0 - y:cy1 - y, cx0 - x:cx1 - x, None]
        region = canvas[cy0:cy1, cx0:cx1]
        canvas[cy0:cy1, cx0:cx1] = region * (1 - a) + colour * a
        objects.append((int(labels[k]), *box))
    return canvas.round().astype(np.uint8), objects


def voc_xml(image_id, size, objects):
    lines = ["<annotation>", "  <folder>fashion_detection</folder>",
             "  <filename>%s.jpg</filename>" % image_id,
             "  <size><width>%d</width><height>%d</height><depth>3</depth></size>" % (size, size)]
    for label, x0, y0, x1, y1 in objects:
        # VOC: 1-based pixel indices, the last pixel included.
        lines += ["  <object>", "    <name>%s</name>" % CLASSES[label],
                  "    <pose>Unspecified</pose>", "    <truncated>0</truncated>",
                  "    <difficult>0</difficult>",
                  "    <bndbox><xmin>%d</xmin><ymin>%d</ymin><xmax>%d</xmax><ymax>%d</ymax>"
                  "</bndbox>" % (x0 + 1, y0 + 1, x1, y1),
                  "  </object>"]
    return "\n".join(lines + ["</annotation>", ""])


def write_split(rng, split, count, items, labels, args):
    ids = []
    for i in range(count):
        image_id = "%s_%06d" % (split, i)
        pixels, objects = make_image(rng, items, labels, args)
        Image.fromarray(pixels).save(os.path.join(args.out, "JPEGImages", image_id + ".jpg"),
                                     quality=90)
        with open(os.path.join(args.out, "Annotations", image_id + ".xml"), "w") as f:
            f.write(voc_xml(image_id, args.size, objects))
        ids.append(image_id)
    list_name = "trainval" if split == "train" else "test"
    with open(os.path.join(args.out, "ImageSets", "Main", list_name + ".txt"), "w") as f:
        f.write("".join(i + "\n" for i in ids))
    return ids


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="data-cache/fashion_detection")
    p.add_argument("--train", type=int, default=4000, help="training images")
    p.add_argument("--test", type=int, default=800, help="test images")
    p.add_argument("--size", type=int, default=128, help="canvas side")
    p.add_argument("--min-side", type=int, default=24, help="smallest item side")
    p.add_argument("--max-side", type=int, default=72, help="largest item side")
    p.add_argument("--min-items", type=int, default=1)
    p.add_argument("--max-items", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not (1 <= args.min_items <= args.max_items and 8 <= args.min_side <= args.max_side):
        sys.exit("make_fashion_detection.py: need 1 <= --min-items <= --max-items and "
                 "8 <= --min-side <= --max-side")
    if args.max_side > args.size:
        sys.exit("make_fashion_detection.py: --max-side %d is larger than --size %d"
                 % (args.max_side, args.size))
    for sub in ("JPEGImages", "Annotations", os.path.join("ImageSets", "Main")):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for split, count, prefix in (("train", args.train, "train"), ("test", args.test, "t10k")):
        items = read_idx(os.path.join(FASHION, prefix + "-images-idx3-ubyte.gz"), True)
        labels = read_idx(os.path.join(FASHION, prefix + "-labels-idx1-ubyte.gz"), False)
        write_split(rng, split, count, items, labels, args)
    print("wrote %d training and %d test images (%dx%d, %d-%d items each) to %s"
          % (args.train, args.test, args.size, args.size, args.min_items, args.max_items,
             args.out))


if __name__ == "__main__":
    main()
