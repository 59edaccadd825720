// SSD's augmentation: boxes follow the pixels (coloured rectangles are found again inside their
// boxes after expand, crop, flip and resize), flips mirror boxes, crops keep an IoU of at least
// the sampled minimum with an object whose centre they hold, every sampler is used, the
// photometric distortion keeps to its ranges, and everything repeats with the same key.
#include "data/detection_transforms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "engine/base/random.h"
#include "tests/data/test_images.h"

namespace cortado {
namespace {

constexpr uint8_t kGrey = 90;
constexpr uint8_t kRed[3] = {255, 0, 0};
constexpr uint8_t kBlue[3] = {0, 0, 255};

// A grey 200x150 image with a red rectangle (label 1) and a blue one (label 2), and their boxes.
struct Scene {
  ImageU8 image;
  std::vector<BoxAnnotation> boxes;
};

Scene MakeScene() {
  Scene s;
  const int w = 200, h = 150;
  s.image.Reshape(w, h, 3);
  std::fill(s.image.pixels.begin(), s.image.pixels.end(), kGrey);
  auto paint = [&](int x0, int y0, int x1, int y1, const uint8_t* rgb, int label) {
    for (int y = y0; y < y1; ++y) {
      for (int x = x0; x < x1; ++x) std::copy(rgb, rgb + 3, s.image.row(y) + 3 * x);
    }
    s.boxes.push_back(BoxAnnotation{label, 0, x0 / float(w), y0 / float(h), x1 / float(w),
                                    y1 / float(h), label == 2});
  };
  paint(40, 30, 100, 80, kRed, 1);
  paint(120, 90, 180, 140, kBlue, 2);
  return s;
}

// Output planes as raw pixel values: mean 0 and std 1/255 make the normalization the identity.
DetectionTransformOptions RawOptions() {
  DetectionTransformOptions o;
  o.mean = {0, 0, 0};
  o.size = 300;
  return o;
}

struct PixelExtent {
  int xmin = 1 << 30, ymin = 1 << 30, xmax = -1, ymax = -1;  // [min, max) in output pixels
  int count = 0;
};

// The extent of the output pixels nearer to `colour` than to the grey, the other rectangle's
// colour and the expand fill.
PixelExtent FindColour(const std::vector<float>& planes, int size, const uint8_t* colour,
                       const std::array<float, 3>& fill) {
  const float others[3][3] = {{kGrey, kGrey, kGrey},
                              {colour == kRed ? 0.f : 255.f, 0, colour == kRed ? 255.f : 0.f},
                              {fill[0] * 255, fill[1] * 255, fill[2] * 255}};
  PixelExtent e;
  const size_t plane = static_cast<size_t>(size) * size;
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      const size_t i = static_cast<size_t>(y) * size + x;
      auto dist = [&](const float* c) {
        double d = 0;
        for (int k = 0; k < 3; ++k) d += std::pow(planes[k * plane + i] - c[k], 2);
        return d;
      };
      const float mine[3] = {float(colour[0]), float(colour[1]), float(colour[2])};
      const double d = dist(mine);
      if (d < dist(others[0]) && d < dist(others[1]) && d < dist(others[2])) {
        e.xmin = std::min(e.xmin, x);
        e.ymin = std::min(e.ymin, y);
        e.xmax = std::max(e.xmax, x + 1);
        e.ymax = std::max(e.ymax, y + 1);
        ++e.count;
      }
    }
  }
  return e;
}

TEST(DetectionTransforms, BoxesFollowThePixels) {
  const Scene scene = MakeScene();
  DetectionTransformOptions o = RawOptions();
  o.distort = false;  // colours must stay recognizable; the distortion is tested below
  DetectionTransformer t(o);
  const int size = o.size;
  std::vector<float> out(3 * size * size);
  std::vector<BoxAnnotation> boxes;
  int checked = 0, expanded = 0, cropped = 0;
  for (uint64_t key = 0; key < 300; ++key) {
    ASSERT_TRUE(t.Pixels(scene.image, scene.boxes, /*train=*/true, key, out.data(), &boxes));
    const ExpandPlan plan = PlanExpand(200, 150, o, key);
    expanded += plan.canvas_width > 200;
    cropped += SampleCrop(plan.canvas_width, plan.canvas_height,
                          ExpandBoxes(scene.boxes, 200, 150, plan), key)
                   .min_iou >= 0;
    for (const BoxAnnotation& b : boxes) {
      ASSERT_GE(b.xmin, 0.0f);
      ASSERT_LE(b.xmax, 1.0f);
      ASSERT_GT(b.xmax, b.xmin);
      ASSERT_GT(b.ymax, b.ymin);
      EXPECT_EQ(b.difficult, b.label == 2);  // the flag travels with its box
      // The box encloses its colour exactly (within a pixel of 300: resampling blurs edges).
      const PixelExtent found = FindColour(out, size, b.label == 1 ? kRed : kBlue, o.mean);
      ASSERT_GT(found.count, 0) << "key " << key << ": a kept box without its colour";
      const double d =
          std::max({std::abs(found.xmin - b.xmin * size), std::abs(found.ymin - b.ymin * size),
                    std::abs(found.xmax - b.xmax * size), std::abs(found.ymax - b.ymax * size)});
      EXPECT_LE(d, 1.0) << "key " << key << " label " << b.label << ": colour at [" << found.xmin
                        << ", " << found.ymin << ", " << found.xmax << ", " << found.ymax
                        << "), box [" << b.xmin * size << ", " << b.ymin * size << ", "
                        << b.xmax * size << ", " << b.ymax * size << "]";
      ++checked;
    }
  }
  // Every step ran on a good share of the keys.
  EXPECT_GT(checked, 250);
  EXPECT_GT(expanded, 100);
  EXPECT_LT(expanded, 200);
  EXPECT_GT(cropped, 200);

  // Evaluation: the whole image resized, boxes as they are.
  ASSERT_TRUE(t.Pixels(scene.image, scene.boxes, /*train=*/false, 7, out.data(), &boxes));
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_EQ(boxes[0].xmin, scene.boxes[0].xmin);
  EXPECT_TRUE(boxes[1].difficult);
  const PixelExtent red = FindColour(out, size, kRed, o.mean);
  EXPECT_NEAR(red.xmin, 40 * 1.5, 1);
  EXPECT_NEAR(red.xmax, 100 * 1.5, 1);
  EXPECT_NEAR(red.ymin, 30 * 2.0, 1);
  EXPECT_NEAR(red.ymax, 80 * 2.0, 1);
}

TEST(DetectionTransforms, FlipsMirrorBoxesAndPixels) {
  std::vector<BoxAnnotation> b = {BoxAnnotation{3, 0, 0.1f, 0.2f, 0.4f, 0.9f, false}};
  FlipBoxes(&b);
  EXPECT_FLOAT_EQ(b[0].xmin, 0.6f);
  EXPECT_FLOAT_EQ(b[0].xmax, 0.9f);
  EXPECT_FLOAT_EQ(b[0].ymin, 0.2f);
  // Only the flip on: a sample is the evaluation image, or its mirror image with mirrored boxes.
  const Scene scene = MakeScene();
  DetectionTransformOptions o = RawOptions();
  o.distort = o.expand = o.iou_crop = false;
  o.size = 64;
  DetectionTransformer t(o);
  std::vector<float> plain(3 * 64 * 64), out(3 * 64 * 64);
  std::vector<BoxAnnotation> plain_boxes, boxes;
  ASSERT_TRUE(t.Pixels(scene.image, scene.boxes, false, 0, plain.data(), &plain_boxes));
  int flips = 0;
  for (uint64_t key = 0; key < 100; ++key) {
    ASSERT_TRUE(t.Pixels(scene.image, scene.boxes, true, key, out.data(), &boxes));
    ASSERT_EQ(boxes.size(), 2u);
    const bool flipped = boxes[0].xmin != plain_boxes[0].xmin;
    flips += flipped;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_FLOAT_EQ(boxes[i].xmin, flipped ? 1 - plain_boxes[i].xmax : plain_boxes[i].xmin);
      EXPECT_FLOAT_EQ(boxes[i].xmax, flipped ? 1 - plain_boxes[i].xmin : plain_boxes[i].xmax);
      EXPECT_EQ(boxes[i].ymin, plain_boxes[i].ymin);
    }
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 64; ++y) {
        for (int x = 0; x < 64; ++x) {
          const size_t at = (c * 64 + y) * 64;
          ASSERT_EQ(out[at + x], plain[at + (flipped ? 63 - x : x)]) << "key " << key;
        }
      }
    }
  }
  EXPECT_GT(flips, 30);
  EXPECT_LT(flips, 70);
}

TEST(DetectionTransforms, CropsKeepTheSampledIouWithAnObjectTheyHold) {
  const int w = 500, h = 375;
  const std::vector<BoxAnnotation> boxes = {
      BoxAnnotation{1, 0, 0.1f, 0.1f, 0.3f, 0.5f, false},
      BoxAnnotation{2, 0, 0.1f, 0.05f, 0.95f, 0.9f, false},   // a large one: IoU 0.9 is possible
      BoxAnnotation{3, 0, 0.7f, 0.05f, 0.75f, 0.1f, false}};  // a small one
  std::map<double, int> by_min_iou;
  for (uint64_t key = 0; key < 3000; ++key) {
    const CropPlan crop = SampleCrop(w, h, boxes, key);
    ++by_min_iou[crop.min_iou];
    const PixelRect& r = crop.rect;
    ASSERT_GE(r.x, 0);
    ASSERT_GE(r.y, 0);
    ASSERT_LE(r.x + r.width, w);
    ASSERT_LE(r.y + r.height, h);
    if (crop.min_iou < 0) {
      EXPECT_EQ(r.width, w);
      EXPECT_EQ(r.height, h);
      continue;
    }
    // SSD's sampler: scale in [0.3, 1], aspect ratio (of the normalized sides) in [1/2, 2].
    const double sw = double(r.width) / w, sh = double(r.height) / h;
    EXPECT_GE(std::sqrt(sw * sh), 0.3 - 0.01);
    EXPECT_GE(sw / sh, 0.5 - 0.02);
    EXPECT_LE(sw / sh, 2.0 + 0.05);
    // Some object whose centre the crop holds overlaps it by at least the minimum; the kept
    // boxes are exactly those objects, clipped to the crop.
    const std::array<double, 4> rect = {double(r.x), double(r.y), double(r.x + r.width),
                                        double(r.y + r.height)};
    double best = -1;
    size_t inside = 0;
    for (const BoxAnnotation& b : boxes) {
      const std::array<double, 4> p = {b.xmin * double(w), b.ymin * double(h), b.xmax * double(w),
                                       b.ymax * double(h)};
      const double cx = (p[0] + p[2]) / 2, cy = (p[1] + p[3]) / 2;
      if (cx > rect[0] && cx < rect[2] && cy > rect[1] && cy < rect[3]) {
        ++inside;
        best = std::max(best, BoxIou(p, rect));
      }
    }
    ASSERT_GT(inside, 0u) << "key " << key;
    EXPECT_GE(best, crop.min_iou) << "key " << key;
    const std::vector<BoxAnnotation> kept = CropBoxes(boxes, w, h, r);
    EXPECT_EQ(kept.size(), inside);
    for (const BoxAnnotation& k : kept) {
      EXPECT_GE(k.xmin, 0.0f);
      EXPECT_LE(k.xmax, 1.0f);
      EXPECT_GE(k.ymin, 0.0f);
      EXPECT_LE(k.ymax, 1.0f);
    }
  }
  // All seven samplers are picked; each that finds a crop within its 50 trials is picked as
  // often as the others, and a high minimum IoU is found less often (as in Caffe SSD).
  for (auto [min_iou, n] : by_min_iou) std::printf("min IoU %4.1f: %d crops\n", min_iou, n);
  ASSERT_EQ(by_min_iou.size(), 7u);
  for (auto [min_iou, n] : by_min_iou) {
    EXPECT_GT(n, min_iou < 0.6 ? 3000 / 7 / 2 : 30) << "min IoU " << min_iou;
  }
  // An image without objects: only the whole image and unconstrained crops.
  std::set<double> kinds;
  for (uint64_t key = 0; key < 100; ++key) kinds.insert(SampleCrop(w, h, {}, key).min_iou);
  EXPECT_EQ(kinds, (std::set<double>{-1.0, 0.0}));
}

TEST(DetectionTransforms, CropBoxesKeepCentresInsideAndClip) {
  const std::vector<BoxAnnotation> boxes = {
      BoxAnnotation{1, 0, 0.0f, 0.0f, 0.5f, 0.5f, false},  // centre (25, 25): inside, clipped
      BoxAnnotation{2, 0, 0.0f, 0.0f, 0.3f, 0.3f, false},  // centre (15, 15): outside, dropped
      BoxAnnotation{3, 1, 0.3f, 0.3f, 0.6f, 0.7f, true}};  // inside the crop
  const PixelRect crop{20, 20, 50, 60};                    // of a 100 x 100 image
  const std::vector<BoxAnnotation> kept = CropBoxes(boxes, 100, 100, crop);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].label, 1);
  EXPECT_FLOAT_EQ(kept[0].xmin, 0.0f);
  EXPECT_FLOAT_EQ(kept[0].xmax, 30.0f / 50);
  EXPECT_FLOAT_EQ(kept[0].ymax, 30.0f / 60);
  EXPECT_EQ(kept[1].label, 3);
  EXPECT_EQ(kept[1].instance_id, 1);
  EXPECT_TRUE(kept[1].difficult);
  EXPECT_FLOAT_EQ(kept[1].xmin, 10.0f / 50);
  EXPECT_FLOAT_EQ(kept[1].ymax, 50.0f / 60);
}

TEST(DetectionTransforms, ExpandPlacesTheImageOnAMeanColouredCanvas) {
  DetectionTransformOptions o = RawOptions();
  o.mean = {0.48235f, 0.45882f, 0.40784f};  // Caffe SSD's (123, 117, 104)
  o.std = {1.0f / 255, 1.0f / 255, 1.0f / 255};
  int expanded = 0;
  double largest = 1;
  for (uint64_t key = 0; key < 1000; ++key) {
    const ExpandPlan p = PlanExpand(100, 80, o, key);
    if (p.canvas_width == 100) continue;
    ++expanded;
    const double ratio = p.canvas_width / 100.0;
    largest = std::max(largest, ratio);
    EXPECT_LE(ratio, 4.0);
    EXPECT_NEAR(p.canvas_height / 80.0, ratio, 0.02);
    EXPECT_GE(p.left, 0);
    EXPECT_LE(p.left + 100, p.canvas_width);
    EXPECT_LE(p.top + 80, p.canvas_height);
  }
  EXPECT_GT(expanded, 420);
  EXPECT_LT(expanded, 580);
  EXPECT_GT(largest, 3.8);
  // Only expand on: outside the image, the fill, which the normalization maps to 0.
  o.distort = o.iou_crop = o.flip = false;
  o.size = 50;
  DetectionTransformer t(o);
  ImageU8 white;
  white.Reshape(100, 80, 3);
  std::fill(white.pixels.begin(), white.pixels.end(), 255);
  std::vector<float> out(3 * 50 * 50);
  std::vector<BoxAnnotation> boxes;
  const std::vector<BoxAnnotation> whole = {BoxAnnotation{1, 0, 0, 0, 1, 1, false}};
  for (uint64_t key = 0; key < 20; ++key) {
    ASSERT_TRUE(t.Pixels(white, whole, true, key, out.data(), &boxes));
    ASSERT_EQ(boxes.size(), 1u);
    const ExpandPlan p = PlanExpand(100, 80, o, key);
    EXPECT_NEAR(boxes[0].xmin, double(p.left) / p.canvas_width, 1e-6);
    EXPECT_NEAR(boxes[0].ymax, double(p.top + 80) / p.canvas_height, 1e-6);
    if (p.canvas_width == 100) continue;
    // A pixel well outside the box is the fill (0 after normalization), one well inside white.
    const int bx = static_cast<int>(boxes[0].xmin * 50), by = static_cast<int>(boxes[0].ymin * 50);
    const int outside_x = bx > 2 ? 0 : 49, outside_y = by > 2 ? 0 : 49;
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(out[(c * 50 + outside_y) * 50 + outside_x], 0.0f, 0.6f) << "key " << key;
    }
  }
}

TEST(DetectionTransforms, PhotometricDistortionKeepsToItsRanges) {
  // A uniform grey image: saturation, hue, contrast and channel order leave it as it is, so
  // only the brightness factor (applied with probability 1/2, in [0.875, 1.125]) shows.
  int changed = 0;
  for (uint64_t key = 0; key < 400; ++key) {
    ImageU8 grey;
    grey.Reshape(16, 8, 3);
    std::fill(grey.pixels.begin(), grey.pixels.end(), 160);
    PhotometricDistort(&grey, key);
    const uint8_t v = grey.pixels[0];
    for (uint8_t p : grey.pixels) ASSERT_EQ(p, v) << "key " << key << ": no longer uniform";
    EXPECT_GE(v, 139);  // 160 * 0.875 - 1
    EXPECT_LE(v, 181);  // 160 * 1.125 + 1
    changed += v != 160;
  }
  EXPECT_GT(changed, 150);
  EXPECT_LT(changed, 250);
  // A photo changes on most keys and repeats with the same key.
  const ImageU8 photo = testing::MakeImage(64, 48, 3, 5);
  int differs = 0;
  for (uint64_t key = 0; key < 50; ++key) {
    ImageU8 a = photo, b = photo;
    PhotometricDistort(&a, key);
    PhotometricDistort(&b, key);
    ASSERT_EQ(a.pixels, b.pixels);
    differs += a.pixels != photo.pixels;
  }
  EXPECT_GT(differs, 40);  // all seven steps skip together only 1/128 of the time
}

TEST(DetectionTransforms, RepeatableWithTheSameKeyOnAnyTransformer) {
  const Scene scene = MakeScene();
  const std::string jpeg = testing::EncodeJpeg(scene.image, 95);
  const DetectionTransformOptions o;  // the SSD recipe: everything on
  DetectionTransformer a(o), b(o);
  std::vector<float> out_a(3 * 300 * 300), out_b(3 * 300 * 300), other(3 * 300 * 300);
  std::vector<BoxAnnotation> boxes_a, boxes_b, boxes_other;
  const auto* data = reinterpret_cast<const uint8_t*>(jpeg.data());
  int differ = 0;
  for (uint64_t key = 0; key < 10; ++key) {
    ASSERT_TRUE(a.Encoded(data, jpeg.size(), scene.boxes, true, key, out_a.data(), &boxes_a))
        << a.message();
    ASSERT_TRUE(b.Encoded(data, jpeg.size(), scene.boxes, true, 99, other.data(), &boxes_other));
    ASSERT_TRUE(b.Encoded(data, jpeg.size(), scene.boxes, true, key, out_b.data(), &boxes_b));
    EXPECT_EQ(out_a, out_b) << "key " << key;
    ASSERT_EQ(boxes_a.size(), boxes_b.size());
    for (size_t i = 0; i < boxes_a.size(); ++i) {
      EXPECT_EQ(boxes_a[i].xmin, boxes_b[i].xmin);
      EXPECT_EQ(boxes_a[i].ymax, boxes_b[i].ymax);
      EXPECT_EQ(boxes_a[i].label, boxes_b[i].label);
    }
    differ += out_a != other;
  }
  EXPECT_GE(differ, 9);
  // A file that is not an image.
  const std::string junk = "not an image";
  EXPECT_FALSE(a.Encoded(reinterpret_cast<const uint8_t*>(junk.data()), junk.size(), {}, true, 0,
                         out_a.data(), &boxes_a));
  EXPECT_FALSE(a.message().empty());
}

// A large photo is decoded at a reduced DCT scale (its boxes are normalized, so only the pixels'
// source resolution changes): the evaluation image matches a full decode resized, within the
// JPEG path's accuracy bound (data/README.md), and training keeps the crops' resolution.
TEST(DetectionTransforms, LargeJpegsAreDecodedSmallerForTheSameResult) {
  const ImageU8 photo = testing::MakeImage(4000, 3000, 3, 2);
  const std::string jpeg = testing::EncodeJpeg(photo, 90);
  const auto* data = reinterpret_cast<const uint8_t*>(jpeg.data());
  const std::vector<BoxAnnotation> boxes = {BoxAnnotation{1, 0, 0.2f, 0.3f, 0.6f, 0.9f, false}};
  DetectionTransformer t(RawOptions());
  std::vector<float> scaled(3 * 300 * 300), full(3 * 300 * 300);
  std::vector<BoxAnnotation> scaled_boxes, full_boxes;
  ASSERT_TRUE(t.Encoded(data, jpeg.size(), boxes, false, 0, scaled.data(), &scaled_boxes));
  EXPECT_EQ(t.last_dct_scale(), 1);  // 500 x 375 still holds 300 x 300
  ImageU8 decoded;
  std::string why;
  ASSERT_TRUE(DecodeWithOpenCV(data, jpeg.size(), false, &decoded, &why)) << why;
  ASSERT_TRUE(t.Pixels(decoded, boxes, false, 0, full.data(), &full_boxes));
  double diff = 0;
  for (size_t i = 0; i < full.size(); ++i) diff += std::abs(scaled[i] - full[i]);
  EXPECT_LT(diff / full.size(), 2.0);
  ASSERT_EQ(scaled_boxes.size(), 1u);
  EXPECT_EQ(scaled_boxes[0].xmin, full_boxes[0].xmin);
  // Training: the smallest crop (0.3 of a side) must still hold 300 pixels: 1/2 of 4000 x 3000.
  ASSERT_TRUE(t.Encoded(data, jpeg.size(), boxes, true, 5, scaled.data(), &scaled_boxes));
  EXPECT_EQ(t.last_dct_scale(), 4);
  // A small photo is decoded whole.
  const std::string small = testing::EncodeJpeg(testing::MakeImage(500, 375, 3, 2), 90);
  ASSERT_TRUE(t.Encoded(reinterpret_cast<const uint8_t*>(small.data()), small.size(), boxes, true,
                        5, scaled.data(), &scaled_boxes));
  EXPECT_EQ(t.last_dct_scale(), 8);
}

}  // namespace
}  // namespace cortado
