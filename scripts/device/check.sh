#!/usr/bin/env bash
# The GPU check, prepared here and run in one command on a machine with a GPU that has no package
# registry (only the working tree and named build outputs travel there):
#   scripts/device/check.sh bundle   here: builds the GPU tests (the engine's test_cuda and
#                                    test_cuda_host, the communication library's codec tests) and
#                                    the cortado binary (JPEG-only: without OpenCV's image codecs,
#                                    whose libraries would not fit), for any
#                                    x86-64 CPU (no -march=native) into build/device/ and packs them
#                                    with the shared libraries they need, except CUDA's own, into
#                                    build/device/bundle/gpu-check.tar.xz (checked to fit, with the
#                                    working tree, in the 64 MiB that travel)
#   scripts/device/check.sh run [STEP...]
#                                    there: runs the steps (default: all, in this order) against
#                                    that machine's CUDA libraries (the toolkit's, or the nvidia-*
#                                    Python wheels next to PyTorch) and writes under $OUT (default
#                                    ./device-out) four files: gpu.txt (nvidia-smi), results.jsonl
#                                    (one JSON line per training measurement, or per step not run),
#                                    summary.txt (each test program's outcome and results.jsonl,
#                                    also printed last) and logs.tar.gz (a .log and gtest .json per
#                                    test program, a .log per training run).
#     tests      every `cuda` test: fails when one fails or is skipped (a skip on a GPU machine
#                means the check did not happen), except the tests that need two GPUs
#                (TensorOnTwoGpus) on one
#     lenet      Cortado trains LeNet 2 epochs on the GPU (Fashion-MNIST from $FASHION_MNIST,
#                default /usr/share/datasets/fashion-mnist; the check wants >= 89% top-1)
#     resnet50   ResNet-50 synthetic training, batch 256 (BATCH), 224x224: PyTorch eager
#                channels-last in fp32, TF32, fp16 AMP and bf16 AMP (torch_resnet50.py), and
#                Cortado (`cortado bench train --device cuda`) in its precisions; img/s and peak
#                GPU memory
#   A Cortado step that cannot run (a bundle without cortado) says so in results.jsonl
#   ("not run") and does not fail the check. The whole run keeps to BUDGET seconds
#   (470: under 8 minutes on an H100 or H200), each program to its own limit within it.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=build/device/bundle
tests=(test_cuda test_cuda_host cortado_distributed_cuda_tests)

# Seconds a run may take in all (BUDGET), and each program in it at most; a program is given
# what is left of the budget when that is less, and one that would start with under 10 s left is
# not started (and says so).
budget=${BUDGET:-470}
tests_limit=${TESTS_LIMIT:-240}     # per test program
lenet_limit=${LENET_LIMIT:-90}
torch_limit=${TORCH_LIMIT:-60}      # per PyTorch precision
cortado_limit=${CORTADO_LIMIT:-60}  # per Cortado precision

bundle_step() {
  local programs=("${tests[@]}" cortado)
  # Without OpenCV's image codecs (GDAL, ICU and a dozen codec libraries, 48 MiB compressed): the
  # checks read Fashion-MNIST's IDX files and synthetic data, and JPEG needs only libjpeg-turbo.
  cmake -S . -B build/device -DCMAKE_BUILD_TYPE=Release -DCORTADO_WERROR=ON \
    -DCORTADO_NATIVE=OFF -DCORTADO_CUDA=ON -DCORTADO_DIST_TESTS=ON -DCORTADO_IMAGE_CODECS=OFF \
    >/dev/null
  cmake --build build/device -j"${CORTADO_BUILD_JOBS:-2}" --target "${programs[@]}"
  local stage=build/device/stage program
  rm -rf "$bundle" "$stage"
  mkdir -p "$bundle" "$stage/lib"
  for program in "${programs[@]}"; do
    find build/device -name "$program" -type f -perm -u+x -not -path "$stage/*" \
      -exec cp {} "$stage/" \; -quit
    [[ -x $stage/$program ]] || { echo "check.sh: $program was not built" >&2; exit 1; }
  done
  strip "${programs[@]/#/$stage/}"
  # Every library outside libc's family and CUDA's (the GPU machine brings its own driver-
  # matched CUDA, cuBLAS and cuDNN).
  ldd "${programs[@]/#/$stage/}" | awk '/=> \// {print $3}' | sort -u |
    while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
        libcuda*|libcublas*|libcudnn*|libnvrtc*|libnvJitLink*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
      esac
    done
  # oneDNN and OpenBLAS alone are 75 MiB: the bundle travels as one xz archive (a fifth of it).
  tar -C "$stage" -cf - . | xz -T"${CORTADO_BUILD_JOBS:-2}" -6 >"$bundle/gpu-check.tar.xz"
  # What travels: the tracked tree and the bundle, 64 MiB together at most.
  local size tree limit
  size=$(du -sm "$bundle" | cut -f1)
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  tree=$(((tree + (1 << 20) - 1) >> 20))
  limit=$((63 - tree))
  echo "check.sh: bundle in $bundle: ${size} MiB (${programs[*]} and $(find "$stage/lib" -type f | wc -l)" \
    "libraries; with the ${tree} MiB tree it may take ${limit})"
  ((size <= limit)) ||
    { echo "check.sh: the bundle is over ${limit} MiB: with the tree it would not travel" >&2; exit 1; }
}

# The seconds a program may take: its own limit, or what is left of the budget; fails when under
# 10 s are left.
limit() {
  local left=$((budget - (SECONDS - run_start)))
  ((left >= 10)) || return 1
  echo $(($1 < left ? $1 : left))
}

# One JSON line into results.jsonl, and on the terminal.
result() {
  echo "$1" | tee -a "$out/results.jsonl"
}

# Whether the bundle's `cortado SUBCOMMAND...` takes --device (the GPU training path); `why`
# says it when not.
cortado_takes_device() {
  if [[ ! -x $bin/cortado ]]; then
    why="the bundle has no cortado (it was packed by an older check.sh: run 'scripts/device/check.sh bundle' again)"
    return 1
  fi
  local help
  help=$("$bin/cortado" "$@" --help 2>&1 || true)
  [[ $help == *--device* ]] && return 0
  why="cortado $* has no --device option yet: training on a GPU is not built (issue 42)"
  return 1
}

tests_step() {
  local status=0 program skipped seconds
  for program in "${tests[@]}"; do
    seconds=$(limit "$tests_limit") || { echo "check.sh: $program not run: out of time" >&2; return 1; }
    timeout "$seconds" "$bin/$program" --gtest_output="json:$logs/$program.json" 2>&1 |
      tee "$logs/$program.log" || status=1
    # Any skipped test but those of TensorOnTwoGpus, which need a second GPU.
    skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$logs/$program.log" |
      grep -v '^\[  SKIPPED \] TensorOnTwoGpus\.' || true)
    if [[ -n "$skipped" ]]; then
      echo "check.sh: $program skipped tests on the GPU machine (see its log)" >&2
      status=1
    fi
  done
  return $status
}

lenet_step() {
  local why data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
  if ! cortado_takes_device train; then
    result "{\"step\": \"lenet\", \"status\": \"not run\", \"why\": \"$why\"}"
    return 0
  fi
  if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
    result "{\"step\": \"lenet\", \"status\": \"not run\", \"why\": \"no Fashion-MNIST in $data (set FASHION_MNIST)\"}"
    return 1
  fi
  local status=0 seconds
  seconds=$(limit "$lenet_limit") ||
    { result '{"step": "lenet", "status": "not run", "why": "out of time"}'; return 1; }
  timeout "$seconds" "$bin/cortado" train --config configs/fashion_lenet.yaml \
    --device cuda --no-progress --overwrite \
    --set "data.train=$data/train-images-idx3-ubyte.gz" \
    --set "data.val=$data/t10k-images-idx3-ubyte.gz" --set solver.max_epochs=2 \
    --set "checkpoint.dir=$logs/lenet-run" --metrics "$logs/lenet-metrics.jsonl" \
    >"$logs/lenet.log" 2>&1 || status=$?
  rm -rf "$logs/lenet-run"  # its checkpoints: not needed back
  local top1
  top1=$(grep -o '"top1": *[0-9.]*' "$logs/lenet-metrics.jsonl" 2>/dev/null | tail -1 |
    grep -o '[0-9.]*$' || true)
  result "{\"step\": \"lenet\", \"status\": $status, \"epochs\": 2, \"top1\": ${top1:-null}}"
  ((status == 0)) && [[ -n $top1 ]] && awk -v t="$top1" 'BEGIN { exit !(t >= 0.89) }'
}

resnet50_step() {
  local status=0 precision line seconds batch=${BATCH:-256}
  for precision in fp32 tf32 fp16 bf16; do
    seconds=$(limit "$torch_limit") || {
      result "{\"framework\": \"pytorch\", \"precision\": \"$precision\", \"status\": \"not run\", \"why\": \"out of time\"}"
      status=1
      continue
    }
    line=$(timeout "$seconds" python3 scripts/device/torch_resnet50.py --batch "$batch" \
      --precision "$precision" 2>"$logs/torch-$precision.log") || {
      line="{\"framework\": \"pytorch\", \"precision\": \"$precision\", \"status\": \"failed\", \"log\": \"torch-$precision.log\"}"
      status=1
    }
    result "$line"
  done
  # ---- Cortado on the GPU: runs once `cortado bench train` takes --device. ----
  local why
  if ! cortado_takes_device bench train; then
    result "{\"framework\": \"cortado\", \"status\": \"not run\", \"why\": \"$why\"}"
    return $status
  fi
  local config=$logs/resnet50-synthetic.yaml
  printf 'model: {builder: resnet50, num_classes: 1000}\ndata: {type: synthetic, batch_size: %s, crop: 224}\nsolver: {base_lr: 0.1, momentum: 0.9, max_iter: 1000}\n' \
    "$batch" >"$config"
  for precision in fp32 fp16 bf16; do
    seconds=$(limit "$cortado_limit") || {
      result "{\"framework\": \"cortado\", \"precision\": \"$precision\", \"status\": \"not run\", \"why\": \"out of time\"}"
      status=1
      continue
    }
    line=$(timeout "$seconds" "$bin/cortado" bench train --config "$config" \
      --device cuda --set "precision.compute=$precision" --warmup 5 --iters 20 --json \
      2>"$logs/cortado-$precision.log") || {
      line="{\"status\": \"failed\", \"log\": \"cortado-$precision.log\"}"
      status=1
    }
    result "$(python3 -c 'import json, sys; j = json.loads(sys.argv[1]); print(json.dumps({"framework": "cortado", "model": "resnet50", "batch": int(sys.argv[2]), "precision": sys.argv[3], **j}))' "$line" "$batch" "$precision")"
  done
  return $status
}

run_step() {
  run_start=$SECONDS
  out=${OUT:-device-out}
  logs=$out/logs
  mkdir -p "$logs"
  [[ -f $bundle/gpu-check.tar.xz ]] || {
    echo "check.sh: no $bundle/gpu-check.tar.xz: run 'scripts/device/check.sh bundle' where it builds and carry $bundle" >&2
    exit 1
  }
  bin=build/device/run
  rm -rf "$bin"
  mkdir -p "$bin"
  # Python's lzma where the machine has no xz.
  tar -C "$bin" -xJf "$bundle/gpu-check.tar.xz" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$bundle/gpu-check.tar.xz" "$bin"
  local cuda_libs
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
  export LD_LIBRARY_PATH="$PWD/$bin/lib:${cuda_libs}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  { nvidia-smi || true; } >"$out/gpu.txt" 2>&1
  local steps=("$@") status=0 step start
  ((${#steps[@]})) || steps=(tests lenet resnet50)
  for step in "${steps[@]}"; do
    case "$step" in
      tests|lenet|resnet50) ;;
      *) echo "check.sh: unknown step '$step' (known: tests, lenet, resnet50)" >&2; exit 2 ;;
    esac
    start=$SECONDS
    echo "== check.sh: $step" >&2
    "${step}_step" || { status=1; echo "check.sh: step $step failed" >&2; }
    echo "== check.sh: $step took $((SECONDS - start)) s" >&2
  done
  # What comes back from a device machine is a few files: the logs go as one archive.
  {
    for program in "${tests[@]}"; do
      [[ -f $logs/$program.log ]] || continue
      echo "$program:"
      grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|^\[  FAILED  \] [A-Za-z]|^\[==========\] [0-9]+ tests?' \
        "$logs/$program.log" || true
    done
    echo "results.jsonl:"
    cat "$out/results.jsonl" 2>/dev/null || true
    echo "check.sh: $((SECONDS - run_start)) s, $( ((status == 0)) && echo passed || echo FAILED)"
  } >"$out/summary.txt"
  tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
  echo "== check.sh: summary" >&2
  cat "$out/summary.txt"
  return $status
}

case "${1:-}" in
  bundle) bundle_step ;;
  run) shift; run_step "$@" ;;
  *)
    sed -n '2,32p' "$0"
    exit 2
    ;;
esac
