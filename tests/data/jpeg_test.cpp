// JpegDecoder: full, region and DCT-scaled decodes against OpenCV's decoder and against each
// other; the odd JPEGs (progressive, grey, CMYK, YCCK, tiny, truncated, empty, not a JPEG).
#include "data/jpeg.h"

#include <gtest/gtest.h>

#include <opencv2/imgproc.hpp>

#include "data/transforms.h"
#include "tests/data/test_images.h"

namespace cortado {
namespace {

using testing::EncodeCmykJpeg;
using testing::EncodeJpeg;
using testing::EncodeYcckJpeg;
using testing::MakeImage;
using testing::MeanAbsDiff;

ImageU8 Decode(const std::string& jpeg) {
  JpegDecoder dec;
  ImageU8 out;
  EXPECT_TRUE(dec.DecodeFull(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size(), &out))
      << dec.message();
  EXPECT_EQ(dec.warnings(), 0) << dec.message();
  return out;
}

ImageU8 OpenCVDecode(const std::string& bytes) {
  ImageU8 out;
  std::string why;
  EXPECT_TRUE(DecodeWithOpenCV(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                               /*keep_gray=*/true, &out, &why))
      << why;
  return out;
}

// The pixels of `rect` of img, as their own image.
ImageU8 Crop(const ImageU8& img, const PixelRect& r) {
  ImageU8 out;
  out.Reshape(r.width, r.height, img.channels);
  for (int y = 0; y < r.height; ++y) {
    std::copy_n(img.row(r.y + y) + r.x * img.channels, r.width * img.channels, out.row(y));
  }
  return out;
}

TEST(Jpeg, FullDecodeMatchesOpenCV) {
  for (int channels : {1, 3}) {
    const std::string jpeg = EncodeJpeg(MakeImage(333, 250, channels), 90);
    JpegHeader header;
    JpegDecoder dec;
    ASSERT_TRUE(dec.Open(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size(), &header));
    EXPECT_EQ(header.width, 333);
    EXPECT_EQ(header.height, 250);
    EXPECT_EQ(header.components, channels);
    EXPECT_EQ(header.color, channels == 1 ? JpegColor::kGray : JpegColor::kYCbCr);
    ImageU8 ours = Decode(jpeg);
    ImageU8 theirs = OpenCVDecode(jpeg);
    ASSERT_EQ(ours.channels, channels);
    // Same library, same settings (islow IDCT, fancy upsampling): the same pixels.
    EXPECT_EQ(MeanAbsDiff(ours, theirs), 0.0);
  }
}

TEST(Jpeg, RegionDecodeEqualsCropOfFullDecode) {
  const std::string jpeg = EncodeJpeg(MakeImage(500, 375, 3), 90);
  const ImageU8 full = Decode(jpeg);
  JpegDecoder dec;
  const auto* data = reinterpret_cast<const uint8_t*>(jpeg.data());
  for (PixelRect rect :
       {PixelRect{0, 0, 500, 375}, PixelRect{17, 33, 200, 100}, PixelRect{499, 374, 1, 1},
        PixelRect{100, 0, 37, 375}, PixelRect{0, 200, 500, 21}}) {
    JpegHeader header;
    ASSERT_TRUE(dec.Open(data, jpeg.size(), &header));
    ImageU8 strip;
    PixelRect roi;
    ASSERT_TRUE(dec.Decode(8, rect, &strip, &roi)) << dec.message();
    ASSERT_EQ(roi.width, rect.width);
    ASSERT_EQ(roi.height, rect.height);
    EXPECT_EQ(MeanAbsDiff(Crop(strip, roi), Crop(full, rect)), 0.0)
        << "rect " << rect.x << "," << rect.y << " " << rect.width << "x" << rect.height;
  }
}

TEST(Jpeg, ScaledRegionCoversTheScaledRect) {
  const std::string jpeg = EncodeJpeg(MakeImage(1000, 800, 3), 90);
  JpegDecoder dec;
  const auto* data = reinterpret_cast<const uint8_t*>(jpeg.data());
  for (int k : {1, 2, 4}) {
    JpegHeader header;
    ASSERT_TRUE(dec.Open(data, jpeg.size(), &header));
    ImageU8 strip;
    PixelRect roi;
    const PixelRect rect{123, 77, 640, 480};
    ASSERT_TRUE(dec.Decode(k, rect, &strip, &roi));
    EXPECT_EQ(roi.width, ScaledDim(123 + 640, k) - 123 * k / 8);
    EXPECT_EQ(roi.height, ScaledDim(77 + 480, k) - 77 * k / 8);
    EXPECT_LE(roi.x + roi.width, strip.width);
    EXPECT_EQ(strip.height, roi.height);
  }
}

TEST(Jpeg, ChooseDctScaleKeepsTheCropLargeEnough) {
  EXPECT_EQ(ChooseDctScale(500, 375, 224, 224), 8);
  EXPECT_EQ(ChooseDctScale(448, 448, 224, 224), 4);
  EXPECT_EQ(ChooseDctScale(447, 2000, 224, 224), 8);
  EXPECT_EQ(ChooseDctScale(1800, 1800, 224, 224), 1);
  EXPECT_EQ(ChooseDctScale(1000, 1000, 224, 224), 2);
  for (int side = 1; side < 3000; side += 37) {
    const int k = ChooseDctScale(side, side, 224, 224);
    EXPECT_TRUE(k == 8 || side * k / 8 >= 224) << side;
  }
}

// The accuracy bound of the fast path, as data/README.md states it: the DCT-scaled region
// decode plus bilinear resize stays within 2 levels (of 255, mean absolute) of a full decode
// plus resize, on the training crops of large photos where the scaled path is taken.
TEST(Jpeg, DctScaledTransformStaysCloseToFullDecode) {
  TransformOptions fast, exact;
  fast.flip = exact.flip = false;
  exact.dct_scaling = false;
  ImageTransformer a(fast), b(exact);
  const std::string jpeg = EncodeJpeg(MakeImage(2000, 1500, 3, 3), 92);
  const auto* data = reinterpret_cast<const uint8_t*>(jpeg.data());
  const int n = 3 * 224 * 224;
  std::vector<float> out_a(n), out_b(n);
  double worst = 0, total = 0;
  for (uint64_t key = 0; key < 12; ++key) {
    ASSERT_TRUE(a.Encoded(data, jpeg.size(), true, key, out_a.data()));
    ASSERT_TRUE(b.Encoded(data, jpeg.size(), true, key, out_b.data()));
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const int c = i / (224 * 224);
      sum += std::abs(out_a[i] - out_b[i]) * fast.std[c] * 255.0;  // back to pixel levels
    }
    worst = std::max(worst, sum / n);
    total += sum / n;
  }
  EXPECT_GT(a.scaled_decodes(), 0);
  std::printf("DCT-scaled vs full decode, mean abs error in levels: worst %.3f, average %.3f\n",
              worst, total / 12);
  EXPECT_LT(worst, 2.0) << "mean abs error in levels, worst crop";
  EXPECT_LT(total / 12, 1.5) << "mean abs error in levels, average";
  // The same bound for the validation transform.
  ASSERT_TRUE(a.Encoded(data, jpeg.size(), false, 0, out_a.data()));
  ASSERT_TRUE(b.Encoded(data, jpeg.size(), false, 0, out_b.data()));
  double sum = 0;
  for (int i = 0; i < n; ++i)
    sum += std::abs(out_a[i] - out_b[i]) * fast.std[i / (224 * 224)] * 255;
  std::printf("validation transform: %.3f\n", sum / n);
  EXPECT_LT(sum / n, 2.0);
}

TEST(Jpeg, ProgressiveDecodesLikeBaseline) {
  const ImageU8 img = MakeImage(320, 240, 3, 1);
  const std::string baseline = EncodeJpeg(img, 90, false);
  const std::string progressive = EncodeJpeg(img, 90, true);
  JpegDecoder dec;
  JpegHeader header;
  ASSERT_TRUE(
      dec.Open(reinterpret_cast<const uint8_t*>(progressive.data()), progressive.size(), &header));
  EXPECT_TRUE(header.progressive);
  // Same quantized coefficients, only ordered differently in the file.
  EXPECT_EQ(MeanAbsDiff(Decode(progressive), Decode(baseline)), 0.0);
  // Region and scaled decodes work on progressive files too.
  ASSERT_TRUE(
      dec.Open(reinterpret_cast<const uint8_t*>(progressive.data()), progressive.size(), &header));
  ImageU8 strip;
  PixelRect roi;
  ASSERT_TRUE(dec.Decode(4, PixelRect{40, 30, 200, 150}, &strip, &roi));
  EXPECT_EQ(roi.width, 100);
  EXPECT_EQ(roi.height, 75);
}

TEST(Jpeg, CmykAndYcckGoThroughOpenCV) {
  const ImageU8 rgb = MakeImage(96, 64, 3, 2);
  for (const std::string& jpeg : {EncodeCmykJpeg(rgb), EncodeYcckJpeg(rgb)}) {
    JpegDecoder dec;
    JpegHeader header;
    ASSERT_TRUE(dec.Open(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size(), &header));
    EXPECT_EQ(header.components, 4);
    EXPECT_TRUE(header.color == JpegColor::kCMYK || header.color == JpegColor::kYCCK);
    ImageU8 out;
    PixelRect roi;
    EXPECT_FALSE(dec.Decode(8, PixelRect{0, 0, 96, 64}, &out, &roi));
    const ImageU8 decoded = OpenCVDecode(jpeg);
    ASSERT_EQ(decoded.channels, 3);
    // JPEG loss on the grain is a few levels; a wrong CMYK convention would be off by ~100.
    EXPECT_LT(MeanAbsDiff(decoded, rgb), 8.0) << "inverted (Adobe) CMYK reads back as the RGB";
  }
}

TEST(Jpeg, TinyImages) {
  for (auto [w, h] : {std::pair{1, 1}, std::pair{2, 3}, std::pair{17, 1}}) {
    for (int channels : {1, 3}) {
      const ImageU8 img = MakeImage(w, h, channels);
      const ImageU8 out = Decode(EncodeJpeg(img, 95));
      EXPECT_EQ(out.width, w);
      EXPECT_EQ(out.height, h);
      // 4:2:0 chroma on a couple of pixels is coarse: only check it is the same picture.
      EXPECT_LT(MeanAbsDiff(out, img), 30.0);
    }
  }
}

TEST(Jpeg, BrokenInputs) {
  JpegDecoder dec;
  JpegHeader header;
  ImageU8 out;
  PixelRect roi;
  EXPECT_FALSE(dec.Open(nullptr, 0, &header));
  EXPECT_NE(dec.message().find("empty"), std::string::npos);
  const std::string text = "this is not an image at all";
  EXPECT_FALSE(dec.Open(reinterpret_cast<const uint8_t*>(text.data()), text.size(), &header));
  const std::string jpeg = EncodeJpeg(MakeImage(200, 150, 3), 90);
  // Cut inside the header: nothing to decode.
  EXPECT_FALSE(dec.DecodeFull(reinterpret_cast<const uint8_t*>(jpeg.data()), 100, &out));
  EXPECT_FALSE(dec.message().empty());
  // Cut inside the entropy-coded data: libjpeg warns, fills the rest with grey, and goes on.
  const size_t cut = jpeg.size() * 6 / 10;
  ASSERT_TRUE(dec.Open(reinterpret_cast<const uint8_t*>(jpeg.data()), cut, &header));
  EXPECT_TRUE(dec.Decode(8, PixelRect{0, 0, 200, 150}, &out, &roi));
  EXPECT_GT(dec.warnings(), 0);
  EXPECT_FALSE(dec.message().empty());
  // The decoder is reusable after all that.
  EXPECT_EQ(MeanAbsDiff(Decode(jpeg), OpenCVDecode(jpeg)), 0.0);
}

}  // namespace
}  // namespace cortado
