// IDX files (MNIST's format): a small pair reads back; headers whose image count times size
// wraps in 64 bits, truncated files and labels that do not match are refused naming the file.
#include "data/idx_source.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/base/error.h"
#include "tests/data/test_images.h"

namespace cortado {
namespace {

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An images file with the given header and pixel bytes.
std::string ImagesFile(uint32_t count, uint32_t height, uint32_t width, const std::string& pixels) {
  return BigEndian(0x803) + BigEndian(count) + BigEndian(height) + BigEndian(width) + pixels;
}

std::string LabelsFile(const std::string& labels) {
  return BigEndian(0x801) + BigEndian(static_cast<uint32_t>(labels.size())) + labels;
}

class IdxTest : public ::testing::Test {
 protected:
  // Writes the pair (uncompressed) and returns the images path.
  std::string Write(const std::string& images, const std::string& labels) {
    testing::WriteFile(dir_ / "x-labels-idx1-ubyte", labels);
    testing::WriteFile(dir_ / "x-images-idx3-ubyte", images);
    return dir_ / "x-images-idx3-ubyte";
  }

  // The error ReadIdxDataset throws, "" when it accepts the pair.
  std::string ErrorReading(const std::string& images, const std::string& labels) {
    try {
      ReadIdxDataset(Write(images, labels));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  testing::TempDir dir_;
};

TEST_F(IdxTest, ASmallPairReadsBack) {
  const IdxDataset d =
      ReadIdxDataset(Write(ImagesFile(2, 2, 3, "abcdefghijkl"), LabelsFile("\1\7")));
  EXPECT_EQ(d.count, 2);
  EXPECT_EQ(d.height, 2);
  EXPECT_EQ(d.width, 3);
  EXPECT_EQ(std::string(d.pixels.begin(), d.pixels.end()), "abcdefghijkl");
  EXPECT_EQ(d.labels, (std::vector<uint8_t>{1, 7}));
}

// 16 images of 2^30 x 2^30 are 2^64 pixels, 0 in 64 bits: a header alone would pass as the
// whole file, and the first sample would be read far outside it.
TEST_F(IdxTest, AHeaderWhoseSizeWrapsIsRefused) {
  const std::string labels = LabelsFile(std::string(16, '\0'));
  for (const std::string& images :
       {ImagesFile(16, 1u << 30, 1u << 30, ""), ImagesFile(4, 1u << 31, 1u << 31, ""),
        ImagesFile(0xffffffffu, 0xffffffffu, 0xffffffffu, "")}) {
    const std::string e = ErrorReading(images, labels);
    EXPECT_NE(e.find("x-images-idx3-ubyte"), std::string::npos) << e;
    EXPECT_NE(e.find("too large"), std::string::npos) << e;
  }
}

TEST_F(IdxTest, TruncatedFilesAndMismatchedLabelsAreNamed) {
  std::string e = ErrorReading(ImagesFile(2, 2, 3, "abcdefghijk"), LabelsFile("\1\7"));
  EXPECT_NE(e.find("x-images-idx3-ubyte' is truncated"), std::string::npos) << e;
  e = ErrorReading(ImagesFile(2, 2, 3, "abcdefghijkl"), LabelsFile("\1"));
  EXPECT_NE(e.find("x-labels-idx1-ubyte' does not hold one label per image"), std::string::npos)
      << e;
  e = ErrorReading("P5\n", LabelsFile("\1"));
  EXPECT_NE(e.find("is not an IDX images file"), std::string::npos) << e;
}

}  // namespace
}  // namespace cortado
