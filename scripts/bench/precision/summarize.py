#!/usr/bin/env python3
"""The table of scripts/bench/precision.sh from its results.jsonl: img/s and peak memory per
framework and precision as the median round [min, max], Cortado's activation and
activation-gradient memory,
and each row's ratios (of medians) against PyTorch bf16 autocast."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402

LABELS = [("cortado", "fp32", "Cortado fp32"), ("cortado", "bf16", "Cortado bf16"),
          ("cortado", "fp16", "Cortado fp16"), ("pytorch", "channels_last", "PyTorch fp32 channels-last"),
          ("pytorch", "bf16", "PyTorch bf16 autocast")]

cell = benchlib.cell


def main():
    rows = benchlib.group_jsonl(sys.argv[1], lambda r: (r["side"], r["mode"]))
    peer = rows.get(("pytorch", "bf16"))
    peer_rate = benchlib.median_of(peer, "img_per_s") if peer else None
    peer_mem = benchlib.median_of(peer, "peak_rss_mb") if peer else None
    print("| framework, precision | img/s | peak memory MB | activations MB | "
          "activation gradients MB | img/s / PyTorch bf16 | memory / PyTorch bf16 |")
    print("|---|---|---|---|---|---|---|")
    for side, mode, label in LABELS:
        rs = rows.get((side, mode))
        if not rs:
            continue
        rate = [r["img_per_s"] for r in rs]
        mem = [r["peak_rss_mb"] for r in rs]
        acts = cell([r["activation_mb"] for r in rs], "%.0f") if side == "cortado" else "-"
        grads = cell([r["activation_grad_mb"] for r in rs], "%.0f") if side == "cortado" else "-"
        ratio = "%.2fx" % (statistics.median(rate) / peer_rate) if peer_rate else "-"
        mratio = "%.2fx" % (statistics.median(mem) / peer_mem) if peer_mem else "-"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (label, cell(rate, "%.2f"), cell(mem, "%.0f"),
                                                        acts, grads, ratio, mratio))


if __name__ == "__main__":
    main()
