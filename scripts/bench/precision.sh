#!/usr/bin/env bash
# Mixed precision side by side: ResNet-50 training steps (batch 16, 224x224, synthetic data,
# THREADS threads) in Cortado fp32, bf16 and fp16 (`cortado bench train --set
# precision.compute=...`) and PyTorch 1.13 fp32 channels-last and bf16 autocast
# (scripts/bench/models/torch_models.py), ROUNDS rounds in turn, each run its own process so
# that peak memory is per run. Prints img/s and peak memory (median round [min, max]), Cortado's
# activation and activation-gradient memory, and the ratios against PyTorch bf16 autocast (the peer to beat).
# Raw JSON lines go to runs/bench-precision-<time>/.
#
# Usage: scripts/bench/precision.sh   Environment: MODEL (resnet50), ROUNDS (3), ITERS (2,
#        after WARMUP 1), THREADS (2), CORTADO_BUILD_DIR (build), PRECISIONS (Cortado's: "fp32
#        bf16 fp16")
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

model=${MODEL:-resnet50}
precisions=${PRECISIONS:-fp32 bf16 fp16}
bench_train_setup precision
config=$out/$model.yaml
bench_train_config "$model" "$config"

for r in $(seq "$rounds"); do
  for precision in $precisions; do
    echo "== round $r/$rounds: cortado $precision" >&2
    "$cortado" bench train --config "$config" --set "precision.compute=$precision" \
      --iters "$iters" --warmup "$warmup" --threads "$threads" --json 2>/dev/null |
      "$py" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'round': $r, 'side': 'cortado', 'mode': '$precision', 'img_per_s': j['img_per_s'], 'peak_rss_mb': j['peak_rss_mb'], 'activation_mb': j['activation_mb'], 'activation_grad_mb': j['activation_grad_mb']}))" >> "$out/results.jsonl"
  done
  for mode in channels_last bf16; do
    echo "== round $r/$rounds: pytorch $mode" >&2
    "$py" scripts/bench/models/torch_models.py --model "$model" --mode "$mode" --batch 16 \
      --threads "$threads" --iters "$iters" --warmup "$warmup" |
      "$py" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'round': $r, 'side': 'pytorch', 'mode': '$mode', 'img_per_s': j['img_per_s'], 'peak_rss_mb': j['peak_rss_mb']}))" >> "$out/results.jsonl"
  done
done
bench_train_finish precision/summarize.py
