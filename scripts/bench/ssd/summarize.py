#!/usr/bin/env python3
"""The table of scripts/bench/ssd.sh from its results.jsonl: SSD300 training img/s and peak
memory, Cortado fp32 beside torchvision's ssd300_vgg16 in fp32 NCHW and channels-last; median
round [min, max], ratios of the medians."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402

LABELS = (("cortado", "fp32", "Cortado fp32"), ("pytorch", "nchw", "PyTorch fp32 NCHW"),
          ("pytorch", "channels_last", "PyTorch fp32 channels-last"))


def main():
    rows = benchlib.group_jsonl(sys.argv[1], lambda r: (r["side"], r["mode"]))
    ours = rows.get(("cortado", "fp32"))
    ours_rate = benchlib.median_of(ours, "img_per_s") if ours else None
    print("| framework, mode | img/s | peak memory MB | Cortado img/s ratio |")
    print("|---|---|---|---|")
    for side, mode, label in LABELS:
        rs = rows.get((side, mode))
        if not rs:
            continue
        rate = [r["img_per_s"] for r in rs]
        mem = [r["peak_rss_mb"] for r in rs]
        ratio = "" if side == "cortado" or not ours_rate else "%.2fx" % (
            ours_rate / statistics.median(rate))
        print("| %s | %s | %s | %s |" % (label, benchlib.cell(rate, "%.2f"), benchlib.cell(mem, "%.0f"),
                                         ratio))


if __name__ == "__main__":
    main()
