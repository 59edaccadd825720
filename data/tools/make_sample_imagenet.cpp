// make_sample_imagenet: writes Fashion-MNIST items as JPEG files in ImageNet's folder layout,
// OUT/train/<class>/<n>.JPEG and OUT/val/<class>/<n>.JPEG, so the ImageNet path (convert ->
// LMDB -> train -> eval) can be shown on a laptop in minutes. The 28x28 items are upscaled
// (bicubic) so that RandomResizedCrop has room to work; they stay 1-channel (grey) JPEGs,
// which the loader repeats to 3 channels. Items are taken in file order, the first N of each
// class, so the output is the same on every run.
//
// Usage: make_sample_imagenet --out DIR [--fashion DIR] [--train-per-class N]
//                             [--val-per-class M] [--size S] [--quality Q]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/idx_source.h"
#include "data/jpeg.h"
#include "data/transforms.h"
#include "engine/base/error.h"

namespace fs = std::filesystem;
using namespace cortado;

namespace {

// Folder names sort in label order, so ImageFolder-style labels equal Fashion-MNIST's.
const char* const kClassNames[10] = {"0_tshirt_top", "1_trouser",   "2_pullover", "3_dress",
                                     "4_coat",       "5_sandal",    "6_shirt",    "7_sneaker",
                                     "8_bag",        "9_ankle_boot"};

std::string FindIdx(const std::string& dir, const std::string& stem) {
  for (const std::string& name : {stem + ".gz", stem}) {
    if (fs::exists(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  }
  Fail("Fashion-MNIST file ", stem, "[.gz] not found in ", dir,
       " (Debian: apt-get install dataset-fashion-mnist)");
}

int64_t WriteSplit(const IdxDataset& data, int64_t per_class, int size, int quality,
                   const fs::path& out) {
  JpegEncoder encoder;
  ImageU8 item, big;
  std::string jpeg;
  std::vector<int64_t> written(10, 0);
  int64_t total = 0;
  for (const char* name : kClassNames) fs::create_directories(out / name);
  for (int64_t i = 0; i < data.count && total < 10 * per_class; ++i) {
    const int label = data.labels[i];
    CORTADO_CHECK(label >= 0 && label < 10, "Fashion-MNIST label ", label, " out of range");
    if (written[label] >= per_class) continue;
    item.Reshape(static_cast<int>(data.width), static_cast<int>(data.height), 1);
    std::copy_n(data.pixels.data() + i * data.width * data.height, data.width * data.height,
                item.pixels.data());
    ResizeImage(item, size, size, &big);
    encoder.Encode(big, quality, /*progressive=*/false, &jpeg);
    char file[32];
    std::snprintf(file, sizeof(file), "%05lld.JPEG", static_cast<long long>(i));
    std::ofstream f(out / kClassNames[label] / file, std::ios::binary);
    f.write(jpeg.data(), static_cast<std::streamsize>(jpeg.size()));
    CORTADO_CHECK(f, "cannot write ", (out / kClassNames[label] / file).string());
    ++written[label];
    ++total;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writes Fashion-MNIST items as an ImageNet-style folder of JPEG files"};
  std::string out, fashion = "/usr/share/datasets/fashion-mnist";
  int64_t train_per_class = 300, val_per_class = 50;
  int size = 64, quality = 90;
  app.add_option("--out", out, "Output folder (train/ and val/ are written in it)")->required();
  app.add_option("--fashion", fashion, "Folder with the Fashion-MNIST IDX files")
      ->capture_default_str();
  app.add_option("--train-per-class", train_per_class, "Training images per class")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--val-per-class", val_per_class, "Validation images per class")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--size", size, "Image side in pixels")
      ->check(CLI::Range(8, 4096))
      ->capture_default_str();
  app.add_option("--quality", quality, "JPEG quality")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const IdxDataset train = ReadIdxDataset(FindIdx(fashion, "train-images-idx3-ubyte"));
    const IdxDataset test = ReadIdxDataset(FindIdx(fashion, "t10k-images-idx3-ubyte"));
    const int64_t n_train =
        WriteSplit(train, train_per_class, size, quality, fs::path(out) / "train");
    const int64_t n_val = WriteSplit(test, val_per_class, size, quality, fs::path(out) / "val");
    std::printf("wrote %lld training and %lld validation JPEGs (%dx%d, 10 classes) to %s\n",
                static_cast<long long>(n_train), static_cast<long long>(n_val), size, size,
                out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_sample_imagenet: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
