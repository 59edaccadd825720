#!/usr/bin/env bash
# Training throughput, Cortado vs PyTorch 1.13 CPU, side by side in one run: LeNet and
# ResNet-20 on Fashion-MNIST, batch 128, the same thread count on both sides, the same model
# definitions (scripts/bench/train_torch.py mirrors models/builders.cpp) and SGD settings.
# The two alternate for --rounds rounds; each cell is the median round with [min, max], and the
# ratio is of the medians. --profile adds Cortado's per-layer breakdown.
#   scripts/bench/train.sh [--threads 2] [--iters 40] [--rounds 3] [--profile]
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

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
bench_cortado --build
bench_load before

printf '%-10s %6s %8s %26s %26s %8s\n' model batch threads "cortado img/s" "pytorch img/s" ratio
summary() {  # "median [min, max]" of the numbers given
  "$py" -c 'import sys, statistics as s; v = [float(x) for x in sys.argv[1:]]; print("%.1f [%.1f, %.1f]" % (s.median(v), min(v), max(v)))' "$@"
}
median() { "$py" -c 'import sys, statistics as s; print(s.median(float(x) for x in sys.argv[1:]))' "$@"; }
for model in lenet resnet20; do
  # Alternate the two frameworks, so that a burst of load on the shared machine hits both.
  cs=() ts=()
  for ((r = 0; r < rounds; r++)); do
    cs+=("$("$cortado" bench train --config "configs/fashion_$model.yaml" \
          --iters "$iters" --threads "$threads" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["img_per_s"])')")
    ts+=("$("$py" scripts/bench/train_torch.py --model "$model" --iters "$iters" \
          --threads "$threads" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["img_per_s"])')")
  done
  printf '%-10s %6d %8d %26s %26s %7.2fx\n' "$model" 128 "$threads" "$(summary "${cs[@]}")" \
    "$(summary "${ts[@]}")" "$("$py" -c "print($(median "${cs[@]}") / $(median "${ts[@]}"))")"
  if [[ -n $profile ]]; then
    "$cortado" bench train --config "configs/fashion_$model.yaml" --iters "$iters" \
      --threads "$threads" --profile
  fi
done
bench_load after
