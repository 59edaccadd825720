#!/usr/bin/env python3
"""Turns ImageNet's flat validation folder into a `cortado convert --list` file.

The ILSVRC2012 validation set is one folder of 50,000 JPEGs (ILSVRC2012_val_00000001.JPEG,
...); its labels come separately. This writes "FILE LABEL" lines, LABEL being the index of the
image's synset (wnid, such as n01440764) in the training database's classes.txt, so that
validation records carry the same labels as training ones:

    scripts/imagenet_val_list.py --labels LOC_val_solution.csv \\
        --classes /data/imagenet/train_lmdb/classes.txt --out /data/imagenet/val_list.txt
    cortado convert --root /data/imagenet/val --list /data/imagenet/val_list.txt \\
        --classes /data/imagenet/train_lmdb/classes.txt --resize-shorter 256 \\
        --out /data/imagenet/val_lmdb

--labels takes either Kaggle's LOC_val_solution.csv ("ImageId,PredictionString" with the wnid
first in the prediction string) or a text file of "FILE WNID" lines (one per image; FILE with
or without its .JPEG extension). Every line must name a synset of classes.txt; an unknown one
stops with the line named. Standard library only.
"""
import argparse
import csv
import os
import sys


DEVKIT_HINT = ("this looks like the devkit's ILSVRC2012_validation_ground_truth.txt: one class "
               "number per line in the devkit's own class order, not synsets, so it cannot be "
               "matched with classes.txt; give --labels LOC_val_solution.csv (Kaggle's copy of "
               "the validation labels, see docs/IMAGENET.md) or a 'FILE WNID' text file")


def read_labels(path):
    """{image id without extension: wnid}"""
    labels = {}
    with open(path, newline="") as f:
        first = f.readline()
        f.seek(0)
        if first.startswith("ImageId,"):
            for n, row in enumerate(csv.DictReader(f), start=2):
                prediction = (row.get("PredictionString") or "").split()
                if not prediction:
                    sys.exit("%s:%d: no synset in PredictionString" % (path, n))
                labels[row["ImageId"]] = prediction[0]
        else:
            for n, line in enumerate(f, start=1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) == 1 and parts[0].isdigit():
                    sys.exit("%s:%d: %s" % (path, n, DEVKIT_HINT))
                if len(parts) != 2:
                    sys.exit("%s:%d: expected 'FILE WNID', got %r" % (path, n, line.strip()))
                labels[os.path.splitext(parts[0])[0]] = parts[1]
    if not labels:
        sys.exit("%s: no labels" % path)
    return labels


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", required=True, help="LOC_val_solution.csv or 'FILE WNID' lines")
    ap.add_argument("--classes", required=True, help="the training database's classes.txt")
    ap.add_argument("--out", required=True, help="list file to write (refused if it exists)")
    ap.add_argument("--ext", default=".JPEG", help="file extension of the images (.JPEG)")
    args = ap.parse_args()
    if os.path.exists(args.out):
        sys.exit("%s exists; remove it or choose another --out" % args.out)
    with open(args.classes) as f:
        classes = [line.strip() for line in f if line.strip()]
    index = {wnid: i for i, wnid in enumerate(classes)}
    labels = read_labels(args.labels)
    lines = []
    for image_id in sorted(labels):
        wnid = labels[image_id]
        if wnid not in index:
            sys.exit("%s: image %s has synset %s, which %s does not list"
                     % (args.labels, image_id, wnid, args.classes))
        lines.append("%s%s %d\n" % (image_id, args.ext, index[wnid]))
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.rename(tmp, args.out)
    print("wrote %d images of %d classes to %s" % (len(lines), len(set(labels.values())), args.out))


if __name__ == "__main__":
    main()
