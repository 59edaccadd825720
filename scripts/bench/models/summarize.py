#!/usr/bin/env python3
"""The table of scripts/bench/models.sh from its results.jsonl: per model and run (training,
inference), Cortado fp32 beside PyTorch's fp32 NCHW, fp32 channels-last and bf16 autocast;
img/s and peak memory as the median round [min, max], ratios of the medians."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402

cell = benchlib.cell


def main():
    rows = benchlib.group_jsonl(sys.argv[1], lambda r: (r["model"], r["run"], r["side"], r["mode"]))
    models = sorted({k[0] for k in rows}, key=lambda m: ["resnet50", "resnet18", "vgg16"].index(m)
                    if m in ["resnet50", "resnet18", "vgg16"] else 9)
    print("| model | run | framework, mode | img/s | peak memory MB | Cortado img/s ratio | "
          "Cortado memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        for run in ("training", "inference"):
            ours = rows.get((model, run, "cortado", "fp32"))
            if not ours:
                continue
            ours_rate = benchlib.median_of(ours, "img_per_s")
            ours_mem = benchlib.median_of(ours, "peak_rss_mb")
            for side, mode in (("cortado", "fp32"), ("pytorch", "nchw"),
                               ("pytorch", "channels_last"), ("pytorch", "bf16")):
                rs = rows.get((model, run, side, mode))
                if not rs:
                    continue
                rate = [r["img_per_s"] for r in rs]
                mem = [r["peak_rss_mb"] for r in rs]
                label = "Cortado fp32" if side == "cortado" else "PyTorch " + {
                    "nchw": "fp32 NCHW", "channels_last": "fp32 channels-last",
                    "bf16": "bf16 autocast"}[mode]
                ratio = "" if side == "cortado" else "%.2fx" % (ours_rate / statistics.median(rate))
                mratio = "" if side == "cortado" else "%.2fx" % (ours_mem / statistics.median(mem))
                print("| %s | %s | %s | %s | %s | %s | %s |" % (
                    model, run, label, cell(rate, "%.1f"), cell(mem, "%.0f"), ratio, mratio))


if __name__ == "__main__":
    main()
