#!/usr/bin/env bash
# The gradient-codec accuracy table: ResNet-20 on Fashion-MNIST (configs/fashion_resnet20.yaml),
# trained as a 2-rank data-parallel job (`cortado launch --nproc 2`, one thread per rank, 2 x 64
# = the config's global batch of 128) with the same seed and recipe for every codec:
#   f32, f16, bf16, epgc11, epgc9 and epgc8 with nearest rounding; epgc11, epgc9 and epgc8 also
#   with truncation, and with nearest rounding plus error feedback.
# The recipe's 10 epochs are cut to --epochs (default 3) so the 12 runs take about an hour on 2
# cores; the cosine schedule is compressed with it. Each run's final top-1 is its evaluation on
# the 10,000 test images after the last epoch. Prints a Markdown table (final top-1, difference
# from f32, bytes each rank sends per step, step time) and writes it with the raw metrics to
# runs/codec-table-<time>/. The row "auto" is distributed.codec: auto with the link fixed at
# --auto-link bytes/s (CORTADO_AUTO_LINK; default 1.25e6, 10 Mbit/s) so that its plan is the
# one a slow link gets, whatever this machine's loopback does; its log names the plan. (At
# 100 Mbit/s ResNet-20's 1.1 MB per step hides behind its backward and the plan is f32
# throughout: the accuracy question is only asked where the lossy codecs are chosen.)
#
#   scripts/experiments/codec_table.sh [--epochs 3] [--only f32-nearest,epgc8-feedback,...]
#       [--auto-link 1.25e6] [--build DIR | --binary PATH]   (--binary: use this cortado)
set -euo pipefail
me=codec_table.sh
root=$(cd "$(dirname "$0")/../.." && pwd)
epochs=3
only=""
build=$root/build
binary=""
auto_link=1.25e6
usage() { echo "$me: $*  (see --help)" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --epochs) epochs=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --binary) binary=${2:?}; shift 2 ;;
    --auto-link) auto_link=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
[[ $epochs =~ ^[1-9][0-9]*$ ]] || usage "--epochs '$epochs': want a positive integer"
data=/usr/share/datasets/fashion-mnist
[[ -f $data/train-images-idx3-ubyte.gz ]] ||
  { echo "$me: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)" >&2; exit 1; }

# name codec rounding error_feedback
variants=(
  "f32-nearest f32 nearest false"
  "f16-nearest f16 nearest false"
  "bf16-nearest bf16 nearest false"
  "epgc11-nearest epgc11 nearest false"
  "epgc9-nearest epgc9 nearest false"
  "epgc8-nearest epgc8 nearest false"
  "epgc11-truncate epgc11 truncate false"
  "epgc9-truncate epgc9 truncate false"
  "epgc8-truncate epgc8 truncate false"
  "epgc11-feedback epgc11 nearest true"
  "epgc9-feedback epgc9 nearest true"
  "epgc8-feedback epgc8 nearest true"
  "auto-feedback auto nearest false"
)

if [[ -n $binary ]]; then
  cortado=$binary
else
  echo "$me: building cortado in $build" >&2
  [[ -f $build/CMakeCache.txt ]] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc)" --target cortado >/dev/null
  cortado=$build/tools/cortado
fi
out=$root/runs/codec-table-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
{
  echo "# $(date -Is), $(nproc) cores, commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (uncommitted changes)')"
  echo "# configs/fashion_resnet20.yaml, 2 ranks x 1 thread x batch 64, $epochs epochs"
} | tee "$out/info.txt"

for v in "${variants[@]}"; do
  read -r name codec rounding feedback <<<"$v"
  if [[ -n $only && ",$only," != *",$name,"* ]]; then continue; fi
  echo "== $name" >&2
  # auto: error feedback is on for its sub-16-bit candidates; the link is fixed.
  CORTADO_AUTO_LINK=$([[ $codec == auto ]] && echo "$auto_link" || echo "") \
  "$cortado" launch --nproc 2 -- "$cortado" train --config "$root/configs/fashion_resnet20.yaml" \
    --threads 1 --no-progress --metrics "$out/$name.jsonl" \
    --set data.batch_size=64 --set solver.max_epochs="$epochs" --set checkpoint.every=0 \
    --set checkpoint.dir="$out/checkpoints/$name" --set distributed.codec="$codec" \
    --set distributed.rounding="$rounding" --set distributed.error_feedback="$feedback" \
    >"$out/$name.log" 2>&1 || { echo "$me: $name failed:" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
  rm -rf "$out/checkpoints/$name"
done

/usr/bin/python3 - "$out" <<'PY' | tee "$out/table.md"
import json, os, statistics, sys
out = sys.argv[1]
names = sorted({f[:-6] for f in os.listdir(out) if f.endswith(".jsonl")},
               key=lambda n: ["f32", "f16", "bf16", "epgc11", "epgc9", "epgc8", "auto"].index(n.split("-")[0]) * 10
               + ["nearest", "truncate", "feedback"].index(n.split("-")[1]))
def load(name):
    recs = [json.loads(l) for l in open(os.path.join(out, name + ".jsonl")) if l.strip()]
    evals = [r for r in recs if r.get("event") == "eval"]
    train = [r for r in recs if r.get("event") == "train"]
    # step time from throughput (global batch 128); the first interval includes start-up
    steps = [128.0 / r["img_per_s"] for r in train[1:]] or [128.0 / r["img_per_s"] for r in train]
    return {"top1": evals[-1]["top1"] * 100 if evals else None,
            "curve": [e["top1"] * 100 for e in evals],
            "bytes": train[-1].get("wire_bytes_per_step") if train else None,
            "step": statistics.median(steps) if steps else None,
            "step_lo": min(steps) if steps else None, "step_hi": max(steps) if steps else None}
res = {n: load(n) for n in names}
base = res.get("f32-nearest", {}).get("top1")
print("| codec | rounding | error feedback | final top-1 (%) | vs f32 (points) | top-1 after each epoch | bytes sent per step per rank | step time (ms) median [min, max] |")
print("|---|---|---|---|---|---|---|---|")
for n in names:
    r = res[n]
    codec, mode = n.split("-")
    diff = "-" if base is None or r["top1"] is None or codec == "f32" else f"{r['top1'] - base:+.2f}"
    curve = " / ".join(f"{c:.2f}" for c in r["curve"])
    mb = "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.3f} MB"
    step = "-" if r["step"] is None else f"{r['step']*1e3:.0f} [{r['step_lo']*1e3:.0f}, {r['step_hi']*1e3:.0f}]"
    print(f"| {codec} | {'nearest' if mode == 'feedback' else mode} | {'yes' if mode == 'feedback' else 'no'} | "
          f"{r['top1']:.2f} | {diff} | {curve} | {mb} | {step} |")
PY
echo "$me: table and raw metrics in $out" >&2
