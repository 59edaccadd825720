#!/usr/bin/env bash
# Trains the full Fashion-MNIST configs and writes EXPERIMENTS.md: test top-1 after every
# epoch and at the end, against the targets (LeNet >= 92.0%, ResNet-20 >= 93.0%, 10 epochs).
# Not part of CI: about 3 minutes for LeNet and 11 for ResNet-20 on 2 idle cores.
#   scripts/experiments/fashion_accuracy.sh [lenet] [resnet20]
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target cortado >/dev/null
# The commit the binary is built from (EXPERIMENTS.md itself does not count as a change).
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
git diff --quiet -- . ':(exclude)EXPERIMENTS.md' 2>/dev/null || commit+=" (with local changes)"
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(lenet resnet20)
out=runs/experiments
mkdir -p "$out"

declare -A target=([lenet]=92.0 [resnet20]=93.0)
rows=()
for m in "${models[@]}"; do
  config=configs/fashion_$m.yaml
  rm -rf "$out/$m"
  start=$(date +%s)
  ./build/tools/cortado train --config "$config" --no-progress \
      --set checkpoint.dir="$out/$m" --metrics "$out/$m.jsonl" 2>&1 | tee "$out/$m.log"
  seconds=$(( $(date +%s) - start ))
  ckpt=$(ls "$out/$m"/ckpt-*.cortado | sort | tail -n 1)
  json=$(./build/tools/cortado eval --config "$config" --checkpoint "$ckpt" --json)
  rows+=("$(/usr/bin/python3 - "$m" "$config" "$out/$m.jsonl" "$json" "${target[$m]}" "$seconds" <<'PY'
import json, sys
m, config, metrics, final, target, seconds = sys.argv[1:]
evals = [json.loads(l) for l in open(metrics) if '"event":"eval"' in l]
final = json.loads(final)
per_epoch = " / ".join("%.2f" % (e["top1"] * 100) for e in evals)
top1 = final["top1"] * 100
verdict = "met" if top1 >= float(target) else "MISSED"
print(f"| {m} | `{config}` | {len(evals)} | {per_epoch} | **{top1:.2f}%** | {target}% | {verdict} | {int(seconds) // 60} min |")
PY
)")
done

{
  echo "# Experiments"
  echo
  echo "Fashion-MNIST test top-1 (10,000 images) with the shipped configs, trained from scratch"
  echo "on this machine ($(nproc) cores). Produced by \`scripts/experiments/fashion_accuracy.sh\`"
  echo "on $(date -u +%Y-%m-%d); the final figure is \`cortado eval\` on the last checkpoint."
  echo
  echo "| model | config | epochs | top-1 after each epoch (%) | final top-1 | target | | wall time |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Commit: ${commit}."
  echo "Wall time includes the per-epoch evaluations and whatever else ran on the machine."
  echo
  echo "Recipe (both configs): SGD with Nesterov momentum 0.9, batch 128, cosine schedule to 0"
  echo "after half an epoch of linear warmup, weight decay 5e-4 (none on BN and bias for"
  echo "ResNet-20), random horizontal flips, Fashion-MNIST mean/std normalization; base lr 0.05"
  echo "(LeNet) and 0.1 (ResNet-20)."
} > EXPERIMENTS.md
cat EXPERIMENTS.md
