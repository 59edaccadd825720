#!/usr/bin/env bash
# ImageNet models side by side, Cortado vs PyTorch 1.13 CPU: ResNet-50, ResNet-18 and VGG-16,
# batch 16, 224x224, synthetic data, THREADS threads each. For each model, ROUNDS rounds in
# turn of: Cortado training and inference (`cortado bench train [--infer] --json`), then
# PyTorch (scripts/bench/models/torch_models.py) fp32 NCHW, fp32 channels-last and bf16
# autocast, training and inference. Each run is its own process, so peak memory (the
# process's peak resident set) is per run. Cells are the median round with [min, max]; ratios
# are of the medians. Raw JSON lines go to runs/bench-models-<time>/.
#
# Usage: scripts/bench/models.sh      Environment: MODELS ("resnet50 resnet18 vgg16"), ROUNDS
#        (3), ITERS (2, after WARMUP 1), THREADS (2), CORTADO_BUILD_DIR (build), TORCH_MODES
#        ("nchw channels_last bf16": PyTorch's modes to run; its best are the last two)
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

models=${MODELS:-resnet50 resnet18 vgg16}
torch_modes=${TORCH_MODES:-nchw channels_last bf16}
bench_train_setup models

for r in $(seq "$rounds"); do
  for model in $models; do
    echo "== round $r/$rounds: $model" >&2
    config=$out/$model.yaml
    bench_train_config "$model" "$config"
    for mode in training inference; do
      flag=""; [[ $mode == inference ]] && flag=--infer
      "$cortado" bench train --config "$config" --iters "$iters" --warmup "$warmup" \
        --threads "$threads" --json $flag 2>/dev/null |
        "$py" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'round': $r, 'model': '$model', 'side': 'cortado', 'mode': 'fp32', 'run': '$mode', 'img_per_s': j['img_per_s'], 'peak_rss_mb': j['peak_rss_mb'], 'activation_planned_peak_mb': j['activation_planned_peak_mb'], 'activation_measured_peak_mb': j['activation_measured_peak_mb'], 'activation_mb': j['activation_mb']}))" >> "$out/results.jsonl"
      for tmode in $torch_modes; do
        "$py" scripts/bench/models/torch_models.py --model "$model" --mode "$tmode" --batch 16 \
          --threads "$threads" --iters "$iters" --warmup "$warmup" $flag |
          "$py" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'round': $r, 'model': '$model', 'side': 'pytorch', 'mode': '$tmode', 'run': '$mode', 'img_per_s': j['img_per_s'], 'peak_rss_mb': j['peak_rss_mb']}))" >> "$out/results.jsonl"
      done
    done
  done
done
bench_train_finish models/summarize.py
