#!/usr/bin/env bash
# The detection miniature end to end: makes the Fashion-MNIST detection set
# (make_fashion_detection.py: 4000 training and 800 test canvases of 128x128), converts both
# splits to LMDB, trains configs/fashion_ssd.yaml (ssd_lite, 16 epochs) and evaluates the last checkpoint,
# printing the per-class table and writing runs/fashion_ssd/eval.json and detections.json (COCO
# results). The set and the databases are made once and reused. About 25-30 minutes on 2 cores
# (EXPERIMENTS.md has the measured figures).
#   scripts/experiments/fashion_detection.sh [--binary PATH] [--set key=value]...
set -euo pipefail
me=fashion_detection.sh
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cortado=""
sets=()
while (($#)); do
  case "$1" in
    --binary) cortado=${2:?}; shift 2 ;;
    --set) sets+=(--set "${2:?}"); shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "$me: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
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
out=runs/fashion_ssd
start=$(date +%s)
"$cortado" train --config configs/fashion_ssd.yaml --no-progress --overwrite \
  --metrics "$out.jsonl" "${sets[@]}"
echo "$me: trained in $(( $(date +%s) - start )) s" >&2
"$cortado" eval --config configs/fashion_ssd.yaml --checkpoint auto "${sets[@]}" \
  --detections "$out/detections.json" --no-progress
"$cortado" eval --config configs/fashion_ssd.yaml --checkpoint auto "${sets[@]}" --json \
  --no-progress >"$out/eval.json"
echo "$me: $out/eval.json, $out/detections.json" >&2
