#!/usr/bin/env bash
# Training throughput, Cortado vs PyTorch 1.13 CPU, side by side in one run: LeNet and
# ResNet-20 on Fashion-MNIST, batch 128, the same thread count on both sides, the same model
# definitions (scripts/bench/train_torch.py mirrors models/builders.cpp) and SGD settings.
# Prints img/s for each and the ratio; --profile adds Cortado's per-layer breakdown.
#   scripts/bench/train.sh [--threads 2] [--iters 40] [--rounds 3] [--profile]
set -euo pipefail
cd "$(dirname "$0")/../.."

threads=2 iters=40 rounds=3 profile=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --profile) profile=--profile; shift ;;
    *) echo "train.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

scripts/setup.sh --bench >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target cortado >/dev/null

printf '%-10s %6s %8s %14s %14s %8s\n' model batch threads "cortado img/s" "pytorch img/s" ratio
for model in lenet resnet20; do
  # Alternate the two frameworks and keep each one's best round, so that a burst of load on
  # the shared machine does not decide the ratio.
  best_c=0 best_t=0
  for ((r = 0; r < rounds; r++)); do
    c=$(./build/tools/cortado bench train --config "configs/fashion_$model.yaml" \
          --iters "$iters" --threads "$threads" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["img_per_s"])')
    t=$(/usr/bin/python3 scripts/bench/train_torch.py --model "$model" --iters "$iters" \
          --threads "$threads" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["img_per_s"])')
    best_c=$(/usr/bin/python3 -c "print(max($best_c, $c))")
    best_t=$(/usr/bin/python3 -c "print(max($best_t, $t))")
  done
  printf '%-10s %6d %8d %14.1f %14.1f %7.2fx\n' "$model" 128 "$threads" "$best_c" "$best_t" \
    "$(/usr/bin/python3 -c "print($best_c / $best_t)")"
  if [[ -n $profile ]]; then
    ./build/tools/cortado bench train --config "configs/fashion_$model.yaml" --iters "$iters" \
      --threads "$threads" --profile
  fi
done
