#!/usr/bin/env bash
# The demo, end to end on data that is on this machine, in a few minutes on 2 cores:
#   1. set up (apt-get) and build,
#   2. write an ImageNet-layout folder of real JPEGs (Fashion-MNIST items) and convert it to
#      Caffe-compatible LMDBs with `cortado convert`,
#   3. train ResNet-20 from the LMDB with the threaded decode/augment loader, as a data-parallel
#      job of 2 ranks (`cortado launch`): each reads half of every epoch, gradients are
#      averaged in buckets overlapped with backward (over UCX: the ranks share their gradient
#      blocks in memory and all-reduce them directly), batch norm is synchronized; 2 x 32 is
#      the config's global batch of 64, so the run follows the one-process recipe,
#   4. evaluate the final checkpoint with `cortado eval`, also on 2 ranks (each takes half of
#      the validation set).
# Everything lands under data-cache/ and runs/demo-<date>-<time>/ (runs/demo links to the
# latest); a rerun trains afresh in a new folder, so an earlier run's checkpoints stay.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "== build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target cortado make_sample_imagenet

echo "== folder of JPEGs -> LMDB"
scripts/make_sample_imagenet.sh data-cache/sample_imagenet

echo "== train (configs/sample_imagenet.yaml) on 2 data-parallel ranks"
# UCX (setup.sh installs libucx-dev, so the build has it): shared memory between the two ranks.
export CORTADO_TRANSPORT=ucx
run=runs/demo-$(date +%Y%m%d-%H%M%S)
build/tools/cortado launch --nproc 2 -- build/tools/cortado train \
  --config configs/sample_imagenet.yaml --set data.batch_size=32 --set distributed.sync_bn=true \
  --set checkpoint.dir="$run" --metrics "$run/metrics.jsonl" --trace "$run/trace.json"

echo "== evaluate the last checkpoint"
# runs/demo: a link to the latest demo run (a folder of that name from an older demo is left as is)
if [[ -L runs/demo || ! -e runs/demo ]]; then ln -sfn "$(basename "$run")" runs/demo; fi
ckpt=$(ls "$run"/ckpt-*.cortado | sort | tail -n 1)
build/tools/cortado launch --nproc 2 -- build/tools/cortado eval \
  --config configs/sample_imagenet.yaml --checkpoint "$ckpt"
echo "metrics: $run/metrics.jsonl   checkpoints: $run/   traces (Perfetto): $run/trace.rank{0,1}.json   (runs/demo links here)"
