#!/usr/bin/env bash
# Converter speed per core: `cortado convert --threads 1` with --resize 256x256 and with
# --resize-shorter 256, beside two loops doing the same image work on the same photos:
#   OpenCV loop  cv::imread + cv::resize (bilinear) + cv::imencode, what Caffe's
#                convert_imageset does per image (scripts/bench/convert/opencv_convert.cpp)
#   PIL loop     Image.open + draft (reduced-size decode) + resize (bilinear) + save JPEG
# All encode at quality 90. The photos are COUNT ImageNet-like JPEGs (longer side 500-800 px)
# made from opencv-doc's examples. Every tool and mode runs ROUNDS times, alternating; cells
# are the median round with [min, max]. Raw rounds go to BENCH_DIR/work/rounds.jsonl.
#
# Usage: scripts/bench/convert.sh     Environment: COUNT (2000), ROUNDS (3), CORTADO_BUILD_DIR
#        (build), BENCH_DIR (data-cache/bench_convert), PHOTOS (/usr/share/doc/opencv-doc/examples/data)
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

count=${COUNT:-2000}
bench_photos convert convert/convert_bench.py

opencv=$work/opencv_convert
if [[ ! -x $opencv || scripts/bench/convert/opencv_convert.cpp -nt $opencv ]]; then
  g++ -O2 -std=c++17 -I/usr/include/opencv4 scripts/bench/convert/opencv_convert.cpp -o "$opencv" \
    -lopencv_imgcodecs -lopencv_imgproc -lopencv_core
fi
echo "== making $count photos in $work/images" >&2
"$py" "$helper" make --src "$photos" --out "$work/images" --count "$count"
bench_load before
"$py" "$helper" run --root "$work/images" --cortado "$cortado" --opencv "$opencv" \
  --rounds "$rounds" --work "$work/work"
bench_load after
