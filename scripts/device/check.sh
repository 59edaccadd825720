#!/usr/bin/env bash
# The GPU checks, prepared here and run on a machine with a GPU that has no package registry
# (only the working tree and named build outputs travel there):
#   scripts/device/check.sh bundle   here: builds the GPU tests (the engine's test_cuda, the
#                                    communication library's codec tests) for any x86-64 CPU (no
#                                    -march=native) into build/device/ and gathers them with the
#                                    shared libraries they need, except CUDA's own, into
#                                    build/device/bundle/ (checked to stay under 60 MiB)
#   scripts/device/check.sh run      there: runs the bundle against that machine's CUDA libraries
#                                    (the toolkit's, or the nvidia-* Python wheels next to
#                                    PyTorch) and writes the results under $OUT (default
#                                    ./device-out): gpu.txt, and a .log and .json per test
#                                    program.
#                                    Fails when a test fails or is skipped (a skip on a GPU
#                                    machine means the check did not happen), except the
#                                    tests that need two GPUs (TensorOnTwoGpus) on one.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=build/device/bundle
programs=(test_cuda cortado_distributed_cuda_tests)

case "${1:-}" in
  bundle)
    cmake -S . -B build/device -DCMAKE_BUILD_TYPE=Release -DCORTADO_WERROR=ON \
      -DCORTADO_NATIVE=OFF -DCORTADO_CUDA=ON -DCORTADO_DIST_TESTS=ON >/dev/null
    cmake --build build/device -j"${CORTADO_BUILD_JOBS:-2}" --target "${programs[@]}"
    rm -rf "$bundle"
    mkdir -p "$bundle/lib"
    cp build/device/tests/test_cuda build/device/distributed/tests/cortado_distributed_cuda_tests \
      "$bundle/"
    # Every library outside libc's family and CUDA's (the GPU machine brings its own driver-
    # matched CUDA, cuBLAS and cuDNN).
    ldd "${programs[@]/#/$bundle/}" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
        libcuda*|libcublas*|libcudnn*|libnvrtc*|libnvJitLink*) ;;
        *) cp -L "$lib" "$bundle/lib/" ;;
      esac
    done
    size=$(du -sm "$bundle" | cut -f1)
    echo "check.sh: bundle in $bundle: ${size} MiB"
    ((size < 60)) || { echo "check.sh: the bundle is over 60 MiB (64 travel at most)" >&2; exit 1; }
    ;;
  run)
    out=${OUT:-device-out}
    mkdir -p "$out"
    for program in "${programs[@]}"; do
      [[ -x $bundle/$program ]] || {
        echo "check.sh: no $bundle/$program: run 'scripts/device/check.sh bundle' here first and carry $bundle" >&2
        exit 1
      }
    done
    cuda_libs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
print(":".join(d for r in roots for d in glob.glob(os.path.join(r, "*", "lib"))))
PY
)
    export LD_LIBRARY_PATH="$PWD/$bundle/lib:${cuda_libs}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    { nvidia-smi || true; } >"$out/gpu.txt" 2>&1
    status=0
    for program in "${programs[@]}"; do
      "$bundle/$program" --gtest_output="json:$out/$program.json" 2>&1 | tee "$out/$program.log" ||
        status=1
      # Any skipped test but those of TensorOnTwoGpus, which need a second GPU.
      skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$out/$program.log" |
        grep -v '^\[  SKIPPED \] TensorOnTwoGpus\.' || true)
      if [[ -n "$skipped" ]]; then
        echo "check.sh: $program skipped tests on the GPU machine (see $out/$program.log)" >&2
        status=1
      fi
    done
    exit $status
    ;;
  *)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
