#!/usr/bin/env bash
# SSD300 training side by side, Cortado vs PyTorch 1.13 CPU: ssd300_vgg16 (11 classes: the
# background and the Fashion-MNIST detection set's 10), BATCH images a step at 300x300, THREADS
# threads each. For ROUNDS rounds in turn: Cortado (`cortado bench train --json` on
# configs/fashion_ssd.yaml with the model set to ssd300_vgg16 and the images resized to 300, so
# its steps also read, decode and augment the LMDB), then torchvision's ssd300_vgg16
# (scripts/bench/ssd/torch_ssd.py: random weights, pre-made random images and boxes) in fp32
# NCHW and channels-last. Cells are the median round with [min, max]; ratios of the medians.
# Needs the detection set: scripts/experiments/fashion_detection.sh makes it (or its first
# steps: make_fashion_detection.py and two `cortado convert`s into data-cache/fashion_detection).
#
# Usage: scripts/bench/ssd.sh      Environment: ROUNDS (3), ITERS (2, after WARMUP 1), THREADS
#        (2), BATCH (8), CORTADO_BUILD_DIR (build)
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

batch=${BATCH:-8}
db=data-cache/fashion_detection/trainval_lmdb
[[ -d $db ]] || { echo "$bench_me: no $db; make it with scripts/experiments/fashion_detection.sh" >&2; exit 1; }
bench_train_setup ssd

for r in $(seq "$rounds"); do
  echo "== round $r/$rounds: cortado" >&2
  "$cortado" bench train --config configs/fashion_ssd.yaml --set model.builder=ssd300_vgg16 \
    --set model.num_classes=11 --set data.resize=300 --set data.batch_size="$batch" \
    --iters "$iters" --warmup "$warmup" --threads "$threads" --json 2>/dev/null |
    "$py" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'round': $r, 'side': 'cortado', 'mode': 'fp32', 'img_per_s': j['img_per_s'], 'peak_rss_mb': j['peak_rss_mb']}))" >> "$out/results.jsonl"
  for mode in nchw channels_last; do
    echo "== round $r/$rounds: pytorch $mode" >&2
    "$py" scripts/bench/ssd/torch_ssd.py --mode "$mode" --batch "$batch" --threads "$threads" \
      --iters "$iters" --warmup "$warmup" |
      "$py" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'round': $r, 'side': 'pytorch', 'mode': '$mode', 'img_per_s': j['img_per_s'], 'peak_rss_mb': j['peak_rss_mb']}))" >> "$out/results.jsonl"
  done
done
bench_train_finish ssd/summarize.py
