#!/usr/bin/env bash
# The ImageNet path in miniature: writes an ImageNet-layout folder of real JPEG images
# (Fashion-MNIST items, upscaled, as OUT/images/{train,val}/<class>/<n>.JPEG), then converts
# both splits to LMDB with `cortado convert`, the validation set reusing the training classes.
# configs/sample_imagenet.yaml trains from the result:
#
#   scripts/make_sample_imagenet.sh
#   build/tools/cortado train --config configs/sample_imagenet.yaml
#
# Usage: scripts/make_sample_imagenet.sh [OUT]       (default: data-cache/sample_imagenet)
# Environment: CORTADO_BUILD_DIR (default build), SAMPLE_TRAIN_PER_CLASS (300),
#              SAMPLE_VAL_PER_CLASS (50), SAMPLE_SIZE (48 pixels).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-data-cache/sample_imagenet}
build=${CORTADO_BUILD_DIR:-build}
cortado=$build/tools/cortado
maker=$build/data/make_sample_imagenet
if [[ ! -x $cortado || ! -x $maker ]]; then
  echo "make_sample_imagenet.sh: build first: cmake --build $build --target cortado make_sample_imagenet" >&2
  exit 1
fi

mkdir -p "$out"
"$maker" --out "$out/images" --size "${SAMPLE_SIZE:-48}" \
  --train-per-class "${SAMPLE_TRAIN_PER_CLASS:-300}" --val-per-class "${SAMPLE_VAL_PER_CLASS:-50}"
"$cortado" convert --root "$out/images/train" --out "$out/train_lmdb" --overwrite
"$cortado" convert --root "$out/images/val" --out "$out/val_lmdb" --overwrite \
  --classes "$out/train_lmdb/classes.txt"
echo "sample ImageNet ready: $out/train_lmdb, $out/val_lmdb"
