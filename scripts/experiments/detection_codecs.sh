#!/usr/bin/env bash
# The source's detection experiment in miniature: configs/fashion_ssd.yaml (ssd_lite on the
# Fashion-MNIST detection set) trained as a 2-rank data-parallel job (`cortado launch --nproc 2`,
# one thread per rank, 2 x 16 = the config's global batch of 32) with the same seed, recipe and
# steps for every gradient codec: f32, f16, epgc11, epgc9 and epgc8 with nearest rounding, each
# without and with error feedback (f32 and f16 lose nothing that feedback could return, so they
# run once). The recipe's epochs are cut to --epochs (default 2; the cosine schedule is compressed
# with it). Each run's figures are `cortado eval` on the 800 test images after its last step:
# VOC mAP@0.5 (11-point) and COCO mAP@[.5:.95]. Prints a Markdown table (figures, differences
# from f32, bytes each rank sends per step) and writes it with the raw metrics to
# runs/detection-codecs-<time>/. About 2 minutes per run and epoch on 2 idle cores, so about
# 35 minutes for the 8 runs at the default 2 epochs.
#
#   scripts/experiments/detection_codecs.sh [--epochs 2] [--only f32,epgc8-feedback,...]
#       [--binary PATH]
set -euo pipefail
me=detection_codecs.sh
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
epochs=2
only=""
cortado=""
usage() { echo "$me: $*  (see --help)" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --epochs) epochs=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    --binary) cortado=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
[[ $epochs =~ ^[1-9][0-9]*$ ]] || usage "--epochs '$epochs': want a positive integer"
if [[ -z $cortado ]]; then
  [[ -f build/CMakeCache.txt ]] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j2 --target cortado >/dev/null
  cortado=build/tools/cortado
fi
data=data-cache/fashion_detection
if [[ ! -f $data/ImageSets/Main/test.txt ]]; then
  /usr/bin/python3 scripts/experiments/make_fashion_detection.py --out "$data" --train 4000 --test 800
fi
[[ -d $data/trainval_lmdb ]] ||
  "$cortado" convert --root "$data" --split trainval --out "$data/trainval_lmdb"
[[ -d $data/test_lmdb ]] ||
  "$cortado" convert --root "$data" --split test --out "$data/test_lmdb" \
    --label-map "$data/trainval_lmdb/labelmap.prototxt"

# name codec error_feedback
variants=(
  "f32 f32 false"
  "f16 f16 false"
  "epgc11 epgc11 false"
  "epgc11-feedback epgc11 true"
  "epgc9 epgc9 false"
  "epgc9-feedback epgc9 true"
  "epgc8 epgc8 false"
  "epgc8-feedback epgc8 true"
)
out=runs/detection-codecs-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
{
  echo "# $(date -Is), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (uncommitted changes)')"
  echo "# configs/fashion_ssd.yaml, 2 ranks x 1 thread x batch 16, $epochs epochs"
} | tee "$out/info.txt"

for v in "${variants[@]}"; do
  read -r name codec feedback <<<"$v"
  if [[ -n $only && ",$only," != *",$name,"* ]]; then continue; fi
  echo "== $name" >&2
  start=$(date +%s)
  "$cortado" launch --nproc 2 -- "$cortado" train --config configs/fashion_ssd.yaml \
    --threads 1 --no-progress --metrics "$out/$name.jsonl" \
    --set data.batch_size=16 --set solver.max_epochs="$epochs" --set solver.eval_interval=0 \
    --set checkpoint.every=0 --set checkpoint.dir="$out/checkpoints/$name" \
    --set distributed.codec="$codec" --set distributed.error_feedback="$feedback" \
    >"$out/$name.log" 2>&1 || { echo "$me: $name failed:" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
  echo "$name $(( $(date +%s) - start ))" >>"$out/seconds.txt"
  # The final evaluation (one process, the same figures as 2 ranks give) with per-class APs.
  "$cortado" eval --checkpoint "$(ls "$out/checkpoints/$name"/ckpt-*.cortado | sort | tail -n 1)" \
    --json --no-progress >"$out/$name.eval.json"
  rm -rf "$out/checkpoints/$name"
done

/usr/bin/python3 - "$out" <<'PY' | tee "$out/table.md"
import json, os, sys
out = sys.argv[1]
order = ["f32", "f16", "epgc11", "epgc11-feedback", "epgc9", "epgc9-feedback", "epgc8",
         "epgc8-feedback"]
names = [n for n in order if os.path.exists(os.path.join(out, n + ".eval.json"))]
seconds = dict(l.split() for l in open(os.path.join(out, "seconds.txt")))
def load(name):
    ev = json.load(open(os.path.join(out, name + ".eval.json")))
    train = [json.loads(l) for l in open(os.path.join(out, name + ".jsonl")) if '"event":"train"' in l]
    return {"map50": ev["map50"] * 100, "map": ev["map"] * 100,
            "bytes": train[-1].get("wire_bytes_per_step") if train else None,
            "loss": train[-1]["loss"] if train else None}
res = {n: load(n) for n in names}
base = res.get("f32")
print("| codec | error feedback | mAP@0.5 (%) | vs f32 | mAP@[.5:.95] (%) | vs f32 | last train loss | bytes sent per step per rank | wall time |")
print("|---|---|---|---|---|---|---|---|---|")
for n in names:
    r = res[n]
    codec = n.split("-")[0]
    d50 = "-" if base is None or n == "f32" else f"{r['map50'] - base['map50']:+.2f}"
    dm = "-" if base is None or n == "f32" else f"{r['map'] - base['map']:+.2f}"
    mb = "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.3f} MB"
    print(f"| {codec} | {'yes' if n.endswith('feedback') else 'no'} | {r['map50']:.2f} | {d50} | "
          f"{r['map']:.2f} | {dm} | {r['loss']:.3f} | {mb} | {int(seconds[n]) // 60} min {int(seconds[n]) % 60} s |")
PY
echo "$me: table and raw metrics in $out" >&2
