#!/usr/bin/env bash
# Data loader speed, Cortado vs PIL + torchvision, per core, on the same ImageNet-sized JPEGs
# and the same transforms (train: RandomResizedCrop 224 + flip + normalize; val: Resize 256 +
# CenterCrop 224 + normalize), both producing float32 CHW tensors.
#
#   Cortado: `cortado bench data --db DB --threads N`, N loader threads in one process.
#   PyTorch: N single-threaded processes (torch.set_num_threads(1)) of PIL + torchvision, as a
#            DataLoader with N workers runs them.
#
# The photos are opencv-doc's example images (Debian: opencv-doc) resized to 500x375 and saved
# at quality 90; `cortado convert` stores them byte for byte, so both sides decode identical
# JPEG bytes. Each side runs ROUNDS times, alternating; the table shows each side's median round
# with the [min, max] of the rounds. Prints the table and the per-core ratio (goal >= 1.5x).
# Per-core figures are meant for THREADS=1 (with more threads they are per thread).
#
# Usage: scripts/bench/data.sh            Environment: THREADS (default: nproc), SECONDS_PER_RUN
#        (10), ROUNDS (3), CORTADO_BUILD_DIR (build), BENCH_DIR (data-cache/bench_data),
#        PHOTOS (/usr/share/doc/opencv-doc/examples/data)
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

threads=${THREADS:-$(nproc)}
seconds=${SECONDS_PER_RUN:-10}
bench_photos data data/pil_torchvision.py

"$py" "$helper" make --src "$photos" --out "$work/images/photos" >/dev/null
"$cortado" convert --root "$work/images" --out "$work/lmdb" --overwrite --json > "$work/convert.json"
count=$(ls "$work/images/photos"/*.JPEG | wc -l)

median() {  # the median round (by images_per_s) of the given files, with the rounds' min and max
  "$py" -c 'import json,sys; rows=sorted((json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:]), key=lambda r: r["images_per_s"]); m=dict(rows[(len(rows)-1)//2]); m["min_images_per_s"]=rows[0]["images_per_s"]; m["max_images_per_s"]=rows[-1]["images_per_s"]; m["rounds"]=len(rows); print(json.dumps(m))' "$@"
}

bench_load before
for mode in train val; do
  flag=""; [[ $mode == val ]] && flag="--val"
  for r in $(seq "$rounds"); do
    echo "== $mode round $r/$rounds: cortado ($threads threads), then PIL + torchvision ($threads processes)" >&2
    "$cortado" bench data --db "$work/lmdb" --threads "$threads" --seconds "$seconds" $flag --json \
      > "$work/cortado_${mode}_$r.json"
    "$py" "$helper" bench --images "$work/images/photos" --procs "$threads" --seconds "$seconds" $flag \
      > "$work/torch_${mode}_$r.json"
  done
  median "$work"/cortado_${mode}_*.json > "$work/cortado_$mode.json"
  median "$work"/torch_${mode}_*.json > "$work/torch_$mode.json"
done
bench_load after

"$py" "$helper" report --images "$count" --cortado "$work/cortado_train.json" --torch "$work/torch_train.json" \
  --cortado-val "$work/cortado_val.json" --torch-val "$work/torch_val.json"
