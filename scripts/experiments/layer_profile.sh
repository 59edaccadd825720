#!/usr/bin/env bash
# Builds scripts/experiments/layer_profile.cpp against a Release build of the tree and prints
# the per-layer time of a training step for LeNet and ResNet-20 (batch 128, 2 threads).
#   scripts/experiments/layer_profile.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
cmake --build "$build" -j2 --target cortado_layers cortado_models cortado_engine >/dev/null
out=$build/layer_profile
g++ -O3 -march=native -std=c++20 -I"$root" "$root/scripts/experiments/layer_profile.cpp" \
  "$build"/layers/CMakeFiles/cortado_layers.dir/*.o "$build/models/libcortado_models.a" \
  "$build/engine/libcortado_engine.a" $(pkg-config --libs openblas) -lyaml-cpp -lz -lpthread \
  -o "$out"
for model in lenet resnet20; do "$out" "$model" 128 2 20; echo; done
