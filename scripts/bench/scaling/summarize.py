#!/usr/bin/python3
"""Summary of scripts/bench/scaling.sh: reads the run folder's metrics and prints a Markdown
table, each figure the median over rounds with [min, max].

Cortado runs: <model>.single.r<k>.jsonl (one rank alone) and
<model>.<rate>.overlap-<true|false>.r<k>.jsonl (rank 0's metrics of 2 ranks): the train records
after the warmup steps (one record per step) give step time, compute, exposed communication and
data wait. PyTorch runs: <model>.<single|rate>.torch.r<k>.jsonl with the measured step times.
Efficiency and hidden fraction are computed per round (against the same round's single-rank run
and overlap-off run), then summarized."""
import argparse
import glob
import json
import os
import re
import statistics
import sys

W = 2  # ranks in every multi-rank run


def spec(text):
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def cortado_run(path, warmup):
    """Per-step means over the measured steps: step, compute, comm_wait, data_wait seconds."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if r.get("event") == "train" and r["iter"] > warmup]
    if not rows:
        print(f"summarize.py: skipping {path}: no train records after {warmup} warmup steps",
              file=sys.stderr)
        return None
    n = len(rows)
    fig = {
        "img_s": None,  # set by the caller (needs the global batch)
        "step_s_list": rows,
        "compute": sum(r["compute_s"] for r in rows) / n,
        "comm_wait": sum(r["comm_wait_s"] for r in rows) / n,
        "data_wait": sum(r["data_wait_s"] for r in rows) / n,
    }
    # The communicator thread's CPU time and wake-ups (rank 0's, per step), where recorded.
    if all("comm_cpu_s" in r for r in rows):
        for key in ("comm_cpu_s", "comm_user_s", "comm_system_s", "comm_wakeups"):
            fig[key] = sum(r[key] for r in rows) / n
    return fig


def fmt(values, digits=2, pct=False):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    k = 100.0 if pct else 1.0
    med, lo, hi = statistics.median(values) * k, min(values) * k, max(values) * k
    unit = "%" if pct else ""
    if len(values) == 1:
        return f"{med:.{digits}f}{unit}"
    return f"{med:.{digits}f}{unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


def cpu_cells(with_cpu):
    """The cells user, system, softirq and idle of a CPU row, over the rounds' figures."""
    return " | ".join(fmt([c[k] for c in with_cpu]) for k in
                      ("user_s", "system_s", "softirq_s", "idle_s"))


def cortado_modes(runs, model, rate):
    """The modes of the Cortado runs of model at rate that ran with other ranks, sorted."""
    return sorted({k[2] for k in runs if k[0] == model and k[1] == rate
                   and k[2] not in ("torch", "alone-a", "alone-b")})


def print_table(title, header, rows):
    """A titled Markdown table (header: "| a | b |"), then a blank line; nothing without rows."""
    if not rows:
        return
    print(title)
    print()
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    print("\n".join(rows))
    print()


def rate_bits(rate):
    m = re.fullmatch(r"([0-9.]+)(k|m|g)?bit(\.ucx)?", rate.lower())
    if not m:
        return None
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--warmup", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--auto-extra", type=int, default=0,
                    help="steps only codec auto runs after --warmup before it is measured (its "
                         "trial): for run folders from before scaling.sh measured every run "
                         "over the same iterations")
    args = ap.parse_args()
    warmup, batch = spec(args.warmup), spec(args.batch)
    out = args.out

    # runs[(model, rate, mode)][round] = figures; rate "single" for one rank alone.
    runs = {}
    params = {}
    for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
        name = os.path.basename(path)[: -len(".jsonl")]
        # <model>.single.r<k>, <model>.single.torch.r<k>, <model>.<rate>.overlap-<x>.r<k>,
        # <model>.<rate>.torch.r<k>
        parts = name.split(".")
        if len(parts) < 3 or not re.fullmatch(r"r\d+", parts[-1]):
            continue
        model, rnd, middle = parts[0], int(parts[-1][1:]), parts[1:-1]
        # <model>.<rate>.ucx...: a run over the UCX transport; its network is "<rate>.ucx".
        if len(middle) >= 3 and middle[1] == "ucx":
            middle = [middle[0] + ".ucx"] + middle[2:]
        if middle == ["single"]:
            rate, mode = "single", "cortado"
        elif len(middle) == 3 and middle[1].startswith("codec-") and middle[2].startswith("overlap-"):
            # <model>.<rate>.codec-<c>.overlap-<x>.r<k>: a compressed run
            rate, mode = middle[0], middle[2] + "+" + middle[1][len("codec-"):]
        elif len(middle) >= 2 and middle[-1] in ("torch", "overlap-true", "overlap-false",
                                                 "alone-a", "alone-b"):
            rate, mode = ".".join(middle[:-1]), middle[-1]
        else:
            continue
        if mode == "torch":
            d = json.loads(open(path).read())
            step = statistics.mean(d["step_s"])
            fig = {"step": step, "img_s": d["world"] * d["batch"] / step}
        else:
            world = 1 if rate in ("single", "none") else W
            extra = args.auto_extra if mode.endswith("+auto") else 0
            fig = cortado_run(path, warmup[model] + extra)
            if fig is None:
                continue
            rows = fig.pop("step_s_list")
            images = len(rows) * world * batch[model]
            seconds = sum(world * batch[model] / r["img_per_s"] for r in rows)
            fig["img_s"] = images / seconds
            fig["step"] = seconds / len(rows)
            if rate == "single" and model not in params:
                log = path[: -len(".jsonl")] + ".log"
                if os.path.exists(log):
                    p = re.search(r"model: (\d+) parameters", open(log).read())
                    if p:
                        params[model] = int(p.group(1))
        cpu = path[: -len(".jsonl")] + ".cpu.json"
        if os.path.exists(cpu) and mode != "torch":
            steps = len(rows)
            fig["cpu"] = {k: v / steps for k, v in json.loads(open(cpu).read()).items()}
        runs.setdefault((model, rate, mode), {})[rnd] = fig

    models = sorted({k[0] for k in runs})
    rates = sorted({k[1] for k in runs if k[1] not in ("single", "none")},
                   key=lambda r: (rate_bits(r) or 0, r))
    print("| model | network | mode | step s | compute s | exposed comm s | efficiency | hidden |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        single = runs.get((model, "single", "cortado"), {})
        tsingle = runs.get((model, "single", "torch"), {})
        print(f"| {model} | none | Cortado, 1 rank alone | {fmt([f['step'] for f in single.values()])} "
              f"| {fmt([f['compute'] for f in single.values()])} | - | - | - |")
        a, b = runs.get((model, "none", "alone-a"), {}), runs.get((model, "none", "alone-b"), {})
        both = [k for k in a if k in b and k in single]
        if both:
            eff = [(a[k]["img_s"] + b[k]["img_s"]) / (W * single[k]["img_s"]) for k in both]
            print(f"| {model} | none | Cortado, 2 single ranks side by side | "
                  f"{fmt([(a[k]['step'] + b[k]['step']) / 2 for k in both])} | "
                  f"{fmt([(a[k]['compute'] + b[k]['compute']) / 2 for k in both])} | - | "
                  f"{fmt(eff, 1, pct=True)} | - |")
        if tsingle:
            print(f"| {model} | none | PyTorch, 1 rank alone | "
                  f"{fmt([f['step'] for f in tsingle.values()])} | - | - | - | - |")
        order = ["f16", "bf16", "epgc11", "epgc11-ef", "epgc9", "epgc9-ef", "epgc8", "epgc8-ef"]
        codecs = sorted({k[2].split("+")[1] for k in runs if "+" in k[2]},
                        key=lambda c: order.index(c) if c in order else 99)
        for rate in rates:
            modes = [("overlap-false", "Cortado, overlap off"),
                     ("overlap-true", "Cortado, overlap on")]
            for c in codecs:
                modes += [(f"overlap-false+{c}", f"Cortado {c}, overlap off"),
                          (f"overlap-true+{c}", f"Cortado {c}, overlap on")]
            modes.append(("torch", "PyTorch DDP (overlap)"))
            for mode, label in modes:
                r = runs.get((model, rate, mode), {})
                if not r:
                    continue
                if mode.startswith("overlap-f32") or "+" not in mode:
                    off = runs.get((model, rate, "overlap-false"), {})
                else:
                    off = runs.get((model, rate, "overlap-false+" + mode.split("+")[1]), {})
                base = tsingle if mode == "torch" else single
                eff = [f["img_s"] / (W * base[k]["img_s"]) for k, f in r.items() if k in base]
                hidden = []
                if mode.startswith("overlap-true"):
                    hidden = [1 - f["comm_wait"] / off[k]["comm_wait"] for k, f in r.items()
                              if k in off and off[k]["comm_wait"] > 0]
                cortado = mode != "torch"
                print(f"| {model} | {rate} | {label} | {fmt([f['step'] for f in r.values()])} | "
                      f"{fmt([f['compute'] for f in r.values()]) if cortado else '-'} | "
                      f"{fmt([f['comm_wait'] for f in r.values()]) if cortado else '-'} | "
                      f"{fmt(eff, 1, pct=True)} | "
                      f"{fmt(hidden, 0, pct=True) if hidden else '-'} |")
    print()
    # CPU time of the whole machine per step, while the measured steps ran.
    cpu_rows = []
    for model in models:
        for rate in ["single"] + rates:
            for mode in cortado_modes(runs, model, rate):
                r = runs.get((model, rate, mode), {})
                with_cpu = [f["cpu"] for f in r.values() if "cpu" in f]
                if not with_cpu:
                    continue
                label = "1 rank alone" if rate == "single" else f"{rate}, {mode.replace('-', ' ')}"
                cpu_rows.append(f"| {model} | {label} | {cpu_cells(with_cpu)} |")
    # The control's CPU (two single ranks side by side) is what the machine spends on two ranks'
    # compute alone; a 2-rank run spends that plus its communication's cost.
    for model in models:
        r = runs.get((model, "none", "alone-a"), {})
        with_cpu = [f["cpu"] for f in r.values() if "cpu" in f]
        if with_cpu:
            cpu_rows.insert(0, f"| {model} | 2 single ranks side by side | {cpu_cells(with_cpu)} |")
    print_table("CPU seconds per step, whole machine (both ends of the link run on its cores):",
                "| model | run | user | system | softirq | idle |", cpu_rows)
    # Where communication's CPU goes, per step: Cortado's own (each rank's communicator thread,
    # measured by the thread itself: what a rank of a real two-host job pays too) against the
    # machine's extra over the side-by-side control; the rest is the emulation (the other end's
    # network stack, veth, tc, their interrupts and timers) and the interference of both with the
    # compute threads (preemption, caches), which only this one-machine set-up pays in full.
    comm_rows = []
    for model in models:
        control = runs.get((model, "none", "alone-a"), {})
        for rate in rates:
            for mode in cortado_modes(runs, model, rate):
                r = runs.get((model, rate, mode), {})
                rounds = [k for k, f in r.items() if "comm_cpu_s" in f]
                if not rounds:
                    continue
                busy = lambda c: c["user_s"] + c["system_s"] + c["softirq_s"]
                extra, rest = [], []
                for k in rounds:
                    f = r[k]
                    if "cpu" in f and k in control and "cpu" in control[k]:
                        e = busy(f["cpu"]) - busy(control[k]["cpu"])
                        extra.append(e)
                        rest.append(e - W * f["comm_cpu_s"])
                comm_rows.append(
                    f"| {model} | {rate}, {mode.replace('-', ' ')} | "
                    f"{fmt([r[k]['comm_cpu_s'] for k in rounds], 3)} | "
                    f"{fmt([r[k]['comm_user_s'] for k in rounds], 3)} / "
                    f"{fmt([r[k]['comm_system_s'] for k in rounds], 3)} | "
                    f"{fmt([r[k]['comm_wakeups'] for k in rounds], 0)} | "
                    f"{fmt(extra) if extra else '-'} | {fmt(rest) if rest else '-'} |")
    print_table("Communication's CPU per step: Cortado's communicator thread (rank 0, per rank) "
                "and the machine's CPU beyond the side-by-side control (both ranks):",
                "| model | run | Cortado comm CPU-s/rank | user / system | wake-ups/rank | "
                "machine extra CPU-s | of it not Cortado's threads (emulation, interference) |",
                comm_rows)
    # The plans `distributed.codec: auto` chose (rank 0's last train record of each run): each
    # codec with its bucket count, in bucket order of first use, and how many plans were made.
    plan_rows = []
    for path in sorted(glob.glob(os.path.join(out, "*.codec-auto.*.jsonl"))):
        records = [json.loads(line) for line in open(path) if line.strip()]
        records = [r for r in records if r.get("event") == "train" and "codec_plan" in r]
        if not records:
            continue
        codecs = records[-1]["codec_plan"].split(",")
        counts = {}
        for c in codecs:
            counts[c] = counts.get(c, 0) + 1
        plan = ", ".join(f"{c} x{n}" for c, n in counts.items())
        name = os.path.basename(path)[: -len(".jsonl")]
        plan_rows.append(f"| {name} | {plan} | {records[-1].get('codec_plans', 1)} | "
                         f"{records[-1]['codec_plan']} |")
    print_table("Plans of distributed.codec: auto (rank 0's last record):",
                "| run | buckets per codec | plans made | codec per bucket, in bucket order |",
                plan_rows)
    for model in models:
        if model in params:
            mb = params[model] * 4 / 1e6
            line = f"{model}: {params[model]:,} parameters, {mb:.1f} MB of f32 gradients; a 2-rank ring sends {mb:.1f} MB each way per step"
            times = []
            for rate in rates:
                bits = rate_bits(rate)
                if bits and not rate.endswith(".ucx"):
                    # TCP goodput at MTU 1500 is 1448/1514 of the link rate (scripts/netem/up.sh).
                    times.append(f"{rate} {mb * 1e6 * 8 / (bits * 1448 / 1514):.2f} s")
            if times:
                line += " (at line rate: " + ", ".join(times) + ")"
            print(line + ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
