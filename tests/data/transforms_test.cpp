// Transforms: RandomResizedCrop's rectangle (torchvision's rules), the validation rectangle
// (torchvision's Resize + CenterCrop), flip, normalization, grey-to-RGB, channel order.
#include "data/transforms.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/data/test_images.h"

namespace cortado {
namespace {

using testing::EncodeJpeg;
using testing::EncodeWithOpenCV;
using testing::MakeImage;

TEST(Transforms, RandomResizedCropRespectsScaleAndRatio) {
  TransformOptions o;
  int fallbacks = 0;
  double mean_area = 0;
  const int n = 4000;
  for (uint64_t key = 0; key < n; ++key) {
    const int w = 500, h = 375;
    const PixelRect r = RandomResizedCropRect(w, h, o, key);
    ASSERT_GE(r.x, 0);
    ASSERT_GE(r.y, 0);
    ASSERT_GT(r.width, 0);
    ASSERT_GT(r.height, 0);
    ASSERT_LE(r.x + r.width, w);
    ASSERT_LE(r.y + r.height, h);
    const double area = static_cast<double>(r.width) * r.height / (w * h);
    const double ratio = static_cast<double>(r.width) / r.height;
    if (r.width == w && r.height == h) {
      ++fallbacks;  // the centre-crop fallback (the whole image: its ratio is allowed)
      continue;
    }
    // Rounding to whole pixels moves area and ratio slightly.
    EXPECT_GE(area, o.scale_min * 0.97);
    EXPECT_LE(area, o.scale_max * 1.01);
    EXPECT_GE(ratio, o.ratio_min * 0.97);
    EXPECT_LE(ratio, o.ratio_max * 1.03);
    mean_area += area;
  }
  // Uniform area fraction in [0.08, 1] truncated by the image bounds: mean well inside.
  mean_area /= (n - fallbacks);
  EXPECT_GT(mean_area, 0.35);
  EXPECT_LT(mean_area, 0.6);
  EXPECT_LT(fallbacks, n / 10);
  // A function of the key only.
  const PixelRect a = RandomResizedCropRect(500, 375, o, 99),
                  b = RandomResizedCropRect(500, 375, o, 99);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.width, b.width);
}

TEST(Transforms, RandomResizedCropFallbackClampsTheRatio) {
  TransformOptions o;
  o.scale_min = o.scale_max = 1.0;  // whole area: only fits when the image ratio is allowed
  const PixelRect wide = RandomResizedCropRect(1000, 100, o, 1);
  EXPECT_EQ(wide.height, 100);
  EXPECT_EQ(wide.width, 133);  // round(100 * 4/3)
  EXPECT_EQ(wide.x, (1000 - 133) / 2);
  const PixelRect tall = RandomResizedCropRect(100, 1000, o, 1);
  EXPECT_EQ(tall.width, 100);
  EXPECT_EQ(tall.height, 133);  // round(100 / (3/4))
}

TEST(Transforms, CenterCropMatchesTorchvision) {
  TransformOptions o;  // Resize(256) + CenterCrop(224)
  // 500x375 -> 341x256 (int(256 * 500 / 375)); the crop starts at round(58.5) = 58 (Python
  // rounds halves to even) and 16; mapped back by 500/341 and 375/256.
  PixelRect r = CenterCropRect(500, 375, o);
  EXPECT_EQ(r.x, 85);        // round(58 * 500 / 341)
  EXPECT_EQ(r.y, 23);        // round(16 * 375 / 256)
  EXPECT_EQ(r.width, 328);   // round(224 * 500 / 341)
  EXPECT_EQ(r.height, 328);  // round(224 * 375 / 256)
  // Square images: centred.
  r = CenterCropRect(256, 256, o);
  EXPECT_EQ(r.x, 16);
  EXPECT_EQ(r.y, 16);
  EXPECT_EQ(r.width, 224);
  EXPECT_EQ(r.height, 224);
  // Images smaller than the crop are upscaled first, so the rectangle stays inside.
  r = CenterCropRect(10, 20, o);
  EXPECT_GE(r.x, 0);
  EXPECT_LE(r.x + r.width, 10);
  EXPECT_LE(r.y + r.height, 20);
}

TEST(Transforms, NormalizesAConstantImage) {
  TransformOptions o;
  o.crop = 8;
  o.val_resize = 8;
  ImageTransformer t(o);
  ImageU8 img;
  img.Reshape(20, 16, 3);
  for (size_t i = 0; i < img.bytes(); i += 3) {
    img.pixels[i] = 200;
    img.pixels[i + 1] = 100;
    img.pixels[i + 2] = 10;
  }
  std::vector<float> out(3 * 64);
  ASSERT_TRUE(t.Pixels(img, PixelLayout::kRGB, true, 5, out.data()));
  const float want[3] = {(200 / 255.f - 0.485f) / 0.229f, (100 / 255.f - 0.456f) / 0.224f,
                         (10 / 255.f - 0.406f) / 0.225f};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(out[c * 64 + i], want[c], 1e-4) << "channel " << c;
  }
  // BGR input (Caffe's raw records) lands in RGB order.
  ASSERT_TRUE(t.Pixels(img, PixelLayout::kBGR, false, 0, out.data()));
  EXPECT_NEAR(out[0], (10 / 255.f - 0.485f) / 0.229f, 1e-4);
  EXPECT_NEAR(out[128], (200 / 255.f - 0.406f) / 0.225f, 1e-4);
}

TEST(Transforms, GreyBecomesThreeEqualChannels) {
  TransformOptions o;
  o.crop = 32;
  o.val_resize = 36;
  o.mean = {0.5f, 0.5f, 0.5f};
  o.std = {0.25f, 0.25f, 0.25f};
  ImageTransformer t(o);
  const std::string jpeg = EncodeJpeg(MakeImage(64, 48, 1), 90);
  std::vector<float> out(3 * 32 * 32);
  ASSERT_TRUE(
      t.Encoded(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size(), true, 3, out.data()));
  for (int i = 0; i < 32 * 32; ++i) {
    EXPECT_EQ(out[i], out[1024 + i]);
    EXPECT_EQ(out[i], out[2048 + i]);
  }
}

TEST(Transforms, FlipMirrorsTheCrop) {
  TransformOptions o;
  o.crop = 16;
  o.val_resize = 16;
  o.scale_min = o.scale_max = 1.0;
  o.ratio_min = 0.5;
  o.ratio_max = 2.0;  // the whole image is always the crop
  TransformOptions no_flip = o;
  no_flip.flip = false;
  ImageTransformer t(o), plain(no_flip);
  const ImageU8 img = MakeImage(16, 16, 3);
  std::vector<float> a(3 * 256), b(3 * 256);
  int flipped = 0;
  for (uint64_t key = 0; key < 20; ++key) {
    ASSERT_TRUE(t.Pixels(img, PixelLayout::kRGB, true, key, a.data()));
    ASSERT_TRUE(plain.Pixels(img, PixelLayout::kRGB, true, key, b.data()));
    if (!FlipOf(key)) {
      EXPECT_EQ(a, b);
      continue;
    }
    ++flipped;
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 16; ++y) {
        for (int x = 0; x < 16; ++x) {
          EXPECT_EQ(a[c * 256 + y * 16 + x], b[c * 256 + y * 16 + 15 - x]);
        }
      }
    }
  }
  EXPECT_GT(flipped, 3);
  EXPECT_LT(flipped, 17);
}

// channels_last writes the same normalized values interleaved (HWC), for RGB, BGR and grey
// sources, in training (crop, flip) and validation. Both compute (v / 255 - mean) / std in f32
// from the same pixel: to within 2 ulps of each other (OpenCV's scaling and the loop may round
// a multiply-add differently).
// How far two computations of (v / 255 - mean) / std as v * alpha + beta may differ: each
// rounds its result (an ulp of it, twice for the two), and either may fuse the multiply-add or
// not (the compiler's choice at each optimization level, OpenCV's per CPU), which adds the
// product's rounding: an ulp of |v * alpha| <= |result| + |beta|, and beta = -mean / std.
float NormalizeBound(float result, const TransformOptions& o) {
  float beta = 0;
  for (int c = 0; c < 3; ++c) beta = std::max(beta, std::fabs(o.mean[c] / o.std[c]));
  return std::ldexp(3 * std::fabs(result) + beta, -23) + 1e-30f;
}

TEST(Transforms, ChannelsLastWritesTheSameValuesInterleaved) {
  TransformOptions o;
  o.crop = 24;
  o.val_resize = 28;
  TransformOptions hwc = o;
  hwc.channels_last = true;
  ImageTransformer planes(o), interleaved(hwc);
  const int n = 24 * 24;
  std::vector<float> a(3 * n), b(3 * n);
  for (int channels : {3, 1}) {
    const ImageU8 img = MakeImage(40, 33, channels);
    for (PixelLayout layout : {PixelLayout::kRGB, PixelLayout::kBGR}) {
      for (bool train : {true, false}) {
        for (uint64_t key = 0; key < 4; ++key) {
          ASSERT_TRUE(planes.Pixels(img, layout, train, key, a.data()));
          ASSERT_TRUE(interleaved.Pixels(img, layout, train, key, b.data()));
          for (int c = 0; c < 3; ++c) {
            for (int p = 0; p < n; ++p) {
              const float want = a[c * n + p], got = b[p * 3 + c];
              ASSERT_LE(std::fabs(got - want), NormalizeBound(want, o))
                  << "channel " << c << " pixel " << p;
            }
          }
        }
      }
    }
  }
}

TEST(Transforms, FallbackFormatsGiveTheSamePixels) {
  // A PNG (lossless, decoded by OpenCV) and raw pixels give identical outputs.
  TransformOptions o;
  o.crop = 48;
  o.val_resize = 56;
  ImageTransformer t(o);
  const ImageU8 img = MakeImage(90, 70, 3, 4);
  const std::string png = EncodeWithOpenCV(img, ".png");
  std::vector<float> a(3 * 48 * 48), b(3 * 48 * 48);
  for (bool train : {false, true}) {
    ASSERT_TRUE(
        t.Encoded(reinterpret_cast<const uint8_t*>(png.data()), png.size(), train, 8, a.data()));
    ASSERT_TRUE(t.Pixels(img, PixelLayout::kRGB, train, 8, b.data()));
    EXPECT_EQ(a, b);
  }
  EXPECT_EQ(t.fallback_decodes(), 2);
  const std::string junk = "GIF89a but not really";
  EXPECT_FALSE(
      t.Encoded(reinterpret_cast<const uint8_t*>(junk.data()), junk.size(), true, 0, a.data()));
  EXPECT_FALSE(t.message().empty());
}

TEST(Transforms, RejectsBadOptions) {
  TransformOptions o;
  o.val_resize = 100;  // smaller than the crop
  EXPECT_THROW(ImageTransformer{o}, Error);
  o = TransformOptions{};
  o.scale_min = 0;
  EXPECT_THROW(ImageTransformer{o}, Error);
  o = TransformOptions{};
  o.std[1] = 0;
  EXPECT_THROW(ImageTransformer{o}, Error);
}

}  // namespace
}  // namespace cortado
