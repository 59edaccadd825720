#!/usr/bin/env bash
# Installs everything Cortado needs to build and test (and python3-matplotlib for
# scripts/plot_metrics.py), with apt-get, non-interactively.
# Idempotent: packages already present are skipped quickly.
#   scripts/setup.sh          build + test dependencies, Fashion-MNIST, sample photos
#   scripts/setup.sh --bench  also the peers the benchmarks compare against (PyTorch, PIL)
#                             and iproute2 (ip, tc) for the scaling experiment
set -euo pipefail

want_bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) want_bench=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --bench)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential g++ cmake pkg-config
  libyaml-cpp-dev libcli11-dev libopenblas-dev libdnnl-dev
  googletest libgtest-dev libgmock-dev
  liblmdb-dev libturbojpeg0-dev libjpeg62-turbo-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
  libprotobuf-dev protobuf-compiler python3-protobuf
  openmpi-bin libopenmpi-dev
  libucx-dev ucx-utils
  zlib1g-dev nlohmann-json3-dev libtinyxml2-dev
  dataset-fashion-mnist opencv-doc
  python3-matplotlib clang-format
)
if [[ $want_bench == 1 ]]; then
  packages+=(python3-torch python3-torchvision python3-pil python3-numpy iproute2)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup.sh: installing ${#missing[@]} package(s): ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup.sh: all ${#packages[@]} packages present"
fi
