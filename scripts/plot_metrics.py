#!/usr/bin/python3
"""Training curves from `cortado train --metrics` files.

  scripts/plot_metrics.py runs/x/metrics.jsonl [more.jsonl ...] [--out curves.png]
                          [--csv table.csv] [--x iter|epoch] [--title TEXT]

Draws four panels against the iteration (the epoch on the top axis), or against the epoch with
--x epoch: the loss (training, and evaluation as dots), the learning rate, top-1 and top-5
accuracy of each evaluation, and training images/s. Several files are overlaid, one colour per
run, labelled by their file name (by their folder for files named metrics.jsonl); a resume
inside a run is marked with a dotted line. --csv writes every train and eval record of every
run as one table (run, event, iter, epoch, time, and the metrics; empty where a record has no
such field). Lines that are not JSON, unknown events and missing fields are skipped, so files
of older versions and of runs cut short still plot.

Needs Debian's python3-matplotlib (scripts/setup.sh installs it). Exit codes: 0 done, 1 no
data or an unreadable file, 2 usage error.
"""
import argparse
import csv
import json
import math
import os
import sys

ME = "plot_metrics.py"
CSV_FIELDS = ["run", "event", "iter", "epoch", "time", "loss", "lr", "img_per_s", "top1", "top5",
              "images", "data_wait_s", "compute_s", "comm_wait_s", "sync_bn_s",
              "wire_bytes_per_step"]


def fail(message, code=1):
    print(f"{ME}: error: {message}", file=sys.stderr)
    sys.exit(code)


def number(record, key):
    """The field as a float, or None when absent or not a finite number."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def run_label(path, taken):
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem == "metrics":
        stem = os.path.basename(os.path.dirname(os.path.abspath(path))) or stem
    label, n = stem, 2
    while label in taken:
        label, n = f"{stem} ({n})", n + 1
    return label


def read_run(path):
    records, bad = [], 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(record, dict):
                    records.append(record)
                else:
                    bad += 1
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    if bad:
        print(f"{ME}: {path}: skipped {bad} line(s) that are not JSON objects", file=sys.stderr)
    return records


def series(records, event, key, x):
    """(xs, ys) of the records of this event that have both x and key."""
    xs, ys = [], []
    for r in records:
        if r.get("event") != event:
            continue
        xv, yv = number(r, x), number(r, key)
        if xv is not None and yv is not None:
            xs.append(xv)
            ys.append(yv)
    return xs, ys


def epoch_per_iter(runs):
    """Epochs per iteration of the first run that records both, for the top axis; else None."""
    for _, records in runs:
        pairs = [(number(r, "iter"), number(r, "epoch")) for r in records]
        pairs = [(i, e) for i, e in pairs if i is not None and e is not None and i > 0]
        if pairs:
            i, e = pairs[-1]
            return e / i if e > 0 else None
    return None


def write_csv(path, runs):
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(CSV_FIELDS)
        rows = 0
        for label, records in runs:
            for r in records:
                if r.get("event") not in ("train", "eval"):
                    continue
                row = [label]
                for key in CSV_FIELDS[1:]:
                    value = r.get(key)
                    row.append("" if value is None or isinstance(value, (dict, list)) else value)
                out.writerow(row)
                rows += 1
    print(f"{ME}: wrote {rows} rows to {path}", file=sys.stderr)


def plot(path, runs, x, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is missing: apt-get install python3-matplotlib (scripts/setup.sh)")
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    (ax_loss, ax_lr), (ax_acc, ax_speed) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = 0
    for n, (label, records) in enumerate(runs):
        c = colours[n % len(colours)]
        xs, ys = series(records, "train", "loss", x)
        if xs:
            ax_loss.plot(xs, ys, "-" if len(xs) > 1 else "o", color=c, label=f"{label} train")
            drawn += 1
        xs, ys = series(records, "eval", "loss", x)
        if xs:
            ax_loss.plot(xs, ys, "o--", color=c, markersize=4, label=f"{label} eval")
            drawn += 1
        xs, ys = series(records, "train", "lr", x)
        if xs:
            ax_lr.plot(xs, ys, "-" if len(xs) > 1 else "o", color=c, label=label)
            drawn += 1
        for key, style in (("top1", "o-"), ("top5", "s:")):
            xs, ys = series(records, "eval", key, x)
            if xs:
                ax_acc.plot(xs, [100 * y for y in ys], style, color=c, markersize=4,
                            label=f"{label} {key.replace('top', 'top-')}")
                drawn += 1
        xs, ys = series(records, "train", "img_per_s", x)
        if xs:
            ax_speed.plot(xs, ys, "-" if len(xs) > 1 else "o", color=c, label=label)
            drawn += 1
        for r in records:
            if r.get("event") == "resume" and number(r, x) is not None:
                for ax in axes.flat:
                    ax.axvline(number(r, x), color=c, linestyle=":", linewidth=1)
    if drawn == 0:
        fail("no train or eval records with the fields to plot in " +
             ", ".join(f"'{label}'" for label, _ in runs))
    for ax, name in ((ax_loss, "loss"), (ax_lr, "learning rate"), (ax_acc, "accuracy (%)"),
                     (ax_speed, "images/s")):
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    for ax in (ax_acc, ax_speed):
        ax.set_xlabel("iteration" if x == "iter" else "epoch")
    rate = epoch_per_iter(runs) if x == "iter" else None
    if rate:
        for ax in (ax_loss, ax_lr):
            top = ax.secondary_xaxis("top", functions=(lambda i: i * rate, lambda e: e / rate))
            top.set_xlabel("epoch")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"{ME}: wrote {path}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(
        prog=ME, description="Training curves from cortado train --metrics files.")
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files (one run each)")
    parser.add_argument("--out", default="curves.png", help="image to write (default: %(default)s)")
    parser.add_argument("--csv", help="also write all train and eval records as a CSV table")
    parser.add_argument("--x", choices=["iter", "epoch"], default="iter",
                        help="horizontal axis (default: %(default)s, epoch on the top axis)")
    parser.add_argument("--title", default="", help="figure title")
    parser.add_argument("--no-plot", action="store_true", help="only write --csv")
    args = parser.parse_args()
    if args.no_plot and not args.csv:
        fail("--no-plot needs --csv", 2)
    runs, taken = [], set()
    for path in args.metrics:
        if os.path.isdir(path):
            fail(f"'{path}' is a folder; expected a metrics file (such as {path}/metrics.jsonl)")
        label = run_label(path, taken)
        taken.add(label)
        runs.append((label, read_run(path)))
    if args.csv:
        write_csv(args.csv, runs)
    if not args.no_plot:
        plot(args.out, runs, args.x, args.title)


if __name__ == "__main__":
    main()
