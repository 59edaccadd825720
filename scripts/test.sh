#!/usr/bin/env bash
# Sets up, builds and runs every test: the whole project (Release, -j2, into build/), then the
# communication library on its own (cmake -S distributed), which proves it links alone.
# CUDA and RDMA tests are labeled and skip with a reason where there is no hardware.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
jobs=${CORTADO_BUILD_JOBS:-2}

echo "== configure + build (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCORTADO_CUDA=OFF >/dev/null
cmake --build build -j"$jobs"

echo "== communication library, stand-alone (build/distributed-alone/)"
cmake -S distributed -B build/distributed-alone -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/distributed-alone -j"$jobs"

echo "== tests"
# The distributed suites run once, in the stand-alone build; everything else in build/.
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 600 -LE distributed
ctest --test-dir build/distributed-alone --output-on-failure -j"$jobs" --timeout 600
