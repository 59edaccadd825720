#include "data/detection_transforms.h"

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "engine/base/error.h"
#include "engine/base/random.h"

namespace cortado {
namespace {

// What a uniform draw decides: each decision has its own stream of the sample's key, so adding
// a trial to one step never shifts the draws of another.
enum Purpose : uint64_t { kDistort = 1, kExpand = 2, kCrop = 3, kFlip = 4 };

double Draw(uint64_t key, Purpose purpose, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return KeyToUniform(HashCombine(HashCombine(key, purpose), (a << 32) | (b << 16) | c));
}

constexpr int kCropTrials = 50;        // Caffe SSD's max_trials
constexpr double kCropScaleMin = 0.3;  // of the image's width and height
constexpr double kCropRatioMin = 0.5;  // crop aspect ratio (width / height, normalized)
constexpr double kCropRatioMax = 2.0;

cv::Mat MatOf(const ImageU8& image) {
  return cv::Mat(image.height, image.width, CV_8UC(image.channels),
                 const_cast<uint8_t*>(image.pixels.data()), image.stride());
}

std::array<double, 4> PixelBoxOf(const BoxAnnotation& b, int width, int height) {
  return {static_cast<double>(b.xmin) * width, static_cast<double>(b.ymin) * height,
          static_cast<double>(b.xmax) * width, static_cast<double>(b.ymax) * height};
}

// Whether a box's centre lies strictly inside the rectangle (torchvision's and Caffe SSD's
// CENTER emit rule).
bool CentreInside(const std::array<double, 4>& box, const PixelRect& r) {
  const double cx = (box[0] + box[2]) / 2, cy = (box[1] + box[3]) / 2;
  return cx > r.x && cx < r.x + r.width && cy > r.y && cy < r.y + r.height;
}

// Clips normalized coordinates to [0, 1]; false when nothing of the box is left.
bool ClipBox(BoxAnnotation* b) {
  b->xmin = std::clamp(b->xmin, 0.0f, 1.0f);
  b->ymin = std::clamp(b->ymin, 0.0f, 1.0f);
  b->xmax = std::clamp(b->xmax, 0.0f, 1.0f);
  b->ymax = std::clamp(b->ymax, 0.0f, 1.0f);
  return b->xmax > b->xmin && b->ymax > b->ymin;
}

// One crop of the batch sampler: scale and aspect ratio as Caffe SSD's SampleBBox draws them
// (the ratio range narrowed so that both sides stay within the image), in whole pixels.
PixelRect DrawCrop(int width, int height, uint64_t key, uint64_t sampler, uint64_t trial) {
  const double scale = kCropScaleMin + (1 - kCropScaleMin) * Draw(key, kCrop, sampler, trial, 0);
  const double lo = std::max(kCropRatioMin, scale * scale);
  const double hi = std::min(kCropRatioMax, 1 / (scale * scale));
  const double ratio = lo + (hi - lo) * Draw(key, kCrop, sampler, trial, 1);
  const double bw = std::min(1.0, scale * std::sqrt(ratio));
  const double bh = std::min(1.0, scale / std::sqrt(ratio));
  const double x0 = (1 - bw) * Draw(key, kCrop, sampler, trial, 2);
  const double y0 = (1 - bh) * Draw(key, kCrop, sampler, trial, 3);
  PixelRect r;
  r.width = std::clamp(static_cast<int>(std::lround(bw * width)), 1, width);
  r.height = std::clamp(static_cast<int>(std::lround(bh * height)), 1, height);
  r.x = std::clamp(static_cast<int>(std::lround(x0 * width)), 0, width - r.width);
  r.y = std::clamp(static_cast<int>(std::lround(y0 * height)), 0, height - r.height);
  return r;
}

}  // namespace

double BoxIou(const std::array<double, 4>& a, const std::array<double, 4>& b) {
  const double iw = std::min(a[2], b[2]) - std::max(a[0], b[0]);
  const double ih = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (iw <= 0 || ih <= 0) return 0;
  const double inter = iw * ih;
  const double area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
  return inter / (area_a + area_b - inter);
}

ExpandPlan PlanExpand(int width, int height, const DetectionTransformOptions& o, uint64_t key) {
  ExpandPlan p{width, height, 0, 0};
  if (!o.expand || o.max_expand_ratio <= 1 || Draw(key, kExpand, 0) >= 0.5) return p;
  const double ratio = 1 + (o.max_expand_ratio - 1) * Draw(key, kExpand, 1);
  p.canvas_width = std::max(width, static_cast<int>(width * ratio));
  p.canvas_height = std::max(height, static_cast<int>(height * ratio));
  p.left = std::min(p.canvas_width - width,
                    static_cast<int>(Draw(key, kExpand, 2) * (p.canvas_width - width + 1)));
  p.top = std::min(p.canvas_height - height,
                   static_cast<int>(Draw(key, kExpand, 3) * (p.canvas_height - height + 1)));
  return p;
}

CropPlan SampleCrop(int width, int height, const std::vector<BoxAnnotation>& boxes, uint64_t key) {
  std::vector<std::array<double, 4>> pixels;
  for (const BoxAnnotation& b : boxes) pixels.push_back(PixelBoxOf(b, width, height));
  // Sampler 0 is the whole image; 1..5 the constrained ones; 6 the unconstrained one.
  std::vector<CropPlan> found = {CropPlan{PixelRect{0, 0, width, height}, -1}};
  constexpr uint64_t kSamplers = std::size(kSsdMinIous) + 1;
  for (uint64_t s = 0; s < kSamplers; ++s) {
    const double min_iou = s < std::size(kSsdMinIous) ? kSsdMinIous[s] : 0.0;
    for (uint64_t t = 0; t < kCropTrials; ++t) {
      const PixelRect r = DrawCrop(width, height, key, s, t);
      const std::array<double, 4> rect = {static_cast<double>(r.x), static_cast<double>(r.y),
                                          static_cast<double>(r.x + r.width),
                                          static_cast<double>(r.y + r.height)};
      bool ok = pixels.empty() && min_iou == 0;  // an image without objects: any crop
      for (const auto& p : pixels) {
        if (CentreInside(p, r) && BoxIou(p, rect) >= min_iou) ok = true;
      }
      if (ok) {
        found.push_back(CropPlan{r, min_iou});
        break;
      }
    }
  }
  const size_t pick =
      std::min(found.size() - 1, static_cast<size_t>(Draw(key, kCrop, 0xffff) * found.size()));
  return found[pick];
}

std::vector<BoxAnnotation> ExpandBoxes(const std::vector<BoxAnnotation>& boxes, int width,
                                       int height, const ExpandPlan& plan) {
  std::vector<BoxAnnotation> out = boxes;
  const double cw = plan.canvas_width, ch = plan.canvas_height;
  for (BoxAnnotation& b : out) {
    b.xmin = static_cast<float>((static_cast<double>(b.xmin) * width + plan.left) / cw);
    b.xmax = static_cast<float>((static_cast<double>(b.xmax) * width + plan.left) / cw);
    b.ymin = static_cast<float>((static_cast<double>(b.ymin) * height + plan.top) / ch);
    b.ymax = static_cast<float>((static_cast<double>(b.ymax) * height + plan.top) / ch);
  }
  return out;
}

std::vector<BoxAnnotation> CropBoxes(const std::vector<BoxAnnotation>& boxes, int width, int height,
                                     const PixelRect& crop) {
  std::vector<BoxAnnotation> out;
  for (const BoxAnnotation& b : boxes) {
    const std::array<double, 4> p = PixelBoxOf(b, width, height);
    if (!CentreInside(p, crop)) continue;
    BoxAnnotation c = b;
    c.xmin = static_cast<float>((p[0] - crop.x) / crop.width);
    c.ymin = static_cast<float>((p[1] - crop.y) / crop.height);
    c.xmax = static_cast<float>((p[2] - crop.x) / crop.width);
    c.ymax = static_cast<float>((p[3] - crop.y) / crop.height);
    if (ClipBox(&c)) out.push_back(c);
  }
  return out;
}

void FlipBoxes(std::vector<BoxAnnotation>* boxes) {
  for (BoxAnnotation& b : *boxes) {
    const float xmin = 1 - b.xmax, xmax = 1 - b.xmin;
    b.xmin = xmin;
    b.xmax = xmax;
  }
}

void PhotometricDistort(ImageU8* image, uint64_t key) {
  CORTADO_CHECK(image->channels == 3, "photometric distortion needs an RGB image");
  cv::Mat rgb;
  MatOf(*image).convertTo(rgb, CV_32FC3, 1.0 / 255);
  auto clamp01 = [&] {
    cv::max(rgb, 0.0, rgb);
    cv::min(rgb, 1.0, rgb);
  };
  // ITU-R 601 luma, as torchvision's rgb_to_grayscale.
  const cv::Matx13f kLuma(0.2989f, 0.587f, 0.114f);
  auto factor = [&](uint64_t i, double lo, double hi) {
    return lo + (hi - lo) * Draw(key, kDistort, i, 1);
  };
  auto contrast = [&] {
    cv::Mat gray;
    cv::transform(rgb, gray, kLuma);
    const double f = factor(2, 0.5, 1.5);
    rgb = rgb * f + cv::Scalar::all((1 - f) * cv::mean(gray)[0]);
    clamp01();
  };
  if (Draw(key, kDistort, 0) < 0.5) {  // brightness
    rgb *= factor(0, 0.875, 1.125);
    clamp01();
  }
  const bool contrast_first = Draw(key, kDistort, 1) < 0.5;
  if (contrast_first && Draw(key, kDistort, 2) < 0.5) contrast();
  if (Draw(key, kDistort, 3) < 0.5) {  // saturation
    cv::Mat gray, gray3;
    cv::transform(rgb, gray, kLuma);
    cv::cvtColor(gray, gray3, cv::COLOR_GRAY2RGB);
    const double f = factor(3, 0.5, 1.5);
    cv::addWeighted(rgb, f, gray3, 1 - f, 0, rgb);
    clamp01();
  }
  if (Draw(key, kDistort, 4) < 0.5) {  // hue: OpenCV's float HSV has H in degrees
    cv::Mat hsv;
    cv::cvtColor(rgb, hsv, cv::COLOR_RGB2HSV);
    const float shift = static_cast<float>(factor(4, -0.05, 0.05) * 360);
    for (int y = 0; y < hsv.rows; ++y) {
      cv::Vec3f* row = hsv.ptr<cv::Vec3f>(y);
      for (int x = 0; x < hsv.cols; ++x) {
        float h = row[x][0] + shift;
        h -= 360.0f * std::floor(h / 360.0f);
        row[x][0] = h;
      }
    }
    cv::cvtColor(hsv, rgb, cv::COLOR_HSV2RGB);
    clamp01();
  }
  if (!contrast_first && Draw(key, kDistort, 5) < 0.5) contrast();
  cv::Mat out = MatOf(*image);
  rgb.convertTo(out, CV_8UC3, 255.0);  // rounds and saturates
  if (Draw(key, kDistort, 6) < 0.5) {  // channel permutation, one of the six
    static constexpr int kPermutations[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                                {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    const int* p = kPermutations[std::min(5, static_cast<int>(Draw(key, kDistort, 6, 1) * 6))];
    const size_t n = static_cast<size_t>(image->width) * image->height;
    for (size_t i = 0; i < n; ++i) {
      uint8_t* px = image->pixels.data() + 3 * i;
      const uint8_t v[3] = {px[0], px[1], px[2]};
      for (int c = 0; c < 3; ++c) px[c] = v[p[c]];
    }
  }
}

DetectionTransformer::DetectionTransformer(const DetectionTransformOptions& options)
    : options_(options) {
  CORTADO_CHECK(options.size > 0 && options.size <= 16384,
                "detection size must be in 1..16384, got ", options.size);
  CORTADO_CHECK(options.max_expand_ratio >= 1, "max_expand_ratio must be >= 1, got ",
                options.max_expand_ratio);
  for (int c = 0; c < 3; ++c) {
    CORTADO_CHECK(options.std[c] > 0, "normalization std must be positive, channel ", c, " has ",
                  options.std[c]);
  }
}

DetectionTransformer::~DetectionTransformer() = default;

bool DetectionTransformer::Encoded(const uint8_t* data, size_t size,
                                   const std::vector<BoxAnnotation>& boxes, bool train,
                                   uint64_t key, float* out,
                                   std::vector<BoxAnnotation>* out_boxes) {
  message_.clear();
  JpegHeader header;
  const bool direct = jpeg_.Open(data, size, &header) && header.color != JpegColor::kCMYK &&
                      header.color != JpegColor::kYCCK && header.color != JpegColor::kUnknown;
  if (direct) {
    // Boxes are normalized, so the image may be decoded smaller: at the smallest DCT scale that
    // keeps the output's resolution in the smallest crop (training: 0.3 of each side), which
    // saves most of the decoding of large photos and bounds the memory a huge one takes.
    const int need =
        train ? static_cast<int>(std::ceil(options_.size / kCropScaleMin)) : options_.size;
    const int k = ChooseDctScale(header.width, header.height, need, need);
    last_dct_scale_ = k;
    source_width_ = header.width;
    source_height_ = header.height;
    PixelRect roi;
    if (!jpeg_.Decode(k, PixelRect{0, 0, header.width, header.height}, &decoded_, &roi)) {
      message_ = jpeg_.message();
      return false;
    }
    if (roi.x != 0 || roi.y != 0 || roi.width != decoded_.width || roi.height != decoded_.height) {
      rgb_.Reshape(roi.width, roi.height, decoded_.channels);
      cv::Mat dst = MatOf(rgb_);
      MatOf(decoded_)(cv::Rect(roi.x, roi.y, roi.width, roi.height)).copyTo(dst);
      std::swap(rgb_, decoded_);
    }
  } else {
    // Not a JPEG libjpeg-turbo decodes to RGB directly: let OpenCV try every format it knows.
    last_dct_scale_ = 8;
    std::string why;
    if (!DecodeWithOpenCV(data, size, /*keep_gray=*/true, &decoded_, &why)) {
      message_ = jpeg_.message().empty() ? why : jpeg_.message();
      return false;
    }
    source_width_ = decoded_.width;
    source_height_ = decoded_.height;
  }
  const int width = source_width_, height = source_height_;
  const bool ok = Pixels(decoded_, boxes, train, key, out, out_boxes);
  source_width_ = width;  // Pixels took the decoded size
  source_height_ = height;
  return ok;
}

bool DetectionTransformer::Pixels(const ImageU8& image, const std::vector<BoxAnnotation>& boxes,
                                  bool train, uint64_t key, float* out,
                                  std::vector<BoxAnnotation>* out_boxes) {
  message_.clear();
  const int w = image.width, h = image.height, size = options_.size;
  source_width_ = w;
  source_height_ = h;
  if (w <= 0 || h <= 0 || (image.channels != 1 && image.channels != 3)) {
    message_ = StrCat("bad image ", w, "x", h, "x", image.channels);
    return false;
  }
  if (!train) {
    ResizeImage(image, size, size, &resized_);
    NormalizeImage(resized_, PixelLayout::kRGB, options_.mean, options_.std, options_.channels_last,
                   planes_, out);
    *out_boxes = boxes;
    return true;
  }
  // Distortion and the mean-coloured canvas need RGB.
  const ImageU8* rgb = &image;
  if (image.channels == 1 || options_.distort) {
    rgb_.Reshape(w, h, 3);
    cv::Mat dst = MatOf(rgb_);
    if (image.channels == 1) {
      cv::cvtColor(MatOf(image), dst, cv::COLOR_GRAY2RGB);
    } else {
      MatOf(image).copyTo(dst);
    }
    if (options_.distort) PhotometricDistort(&rgb_, key);
    rgb = &rgb_;
  }
  const ExpandPlan expand = PlanExpand(w, h, options_, key);
  const int cw = expand.canvas_width, ch = expand.canvas_height;
  std::vector<BoxAnnotation> canvas_boxes = ExpandBoxes(boxes, w, h, expand);
  const CropPlan crop = options_.iou_crop ? SampleCrop(cw, ch, canvas_boxes, key)
                                          : CropPlan{PixelRect{0, 0, cw, ch}, -1};
  out_boxes->clear();
  if (crop.min_iou < 0) {  // the whole canvas
    for (BoxAnnotation b : canvas_boxes) {
      if (ClipBox(&b)) out_boxes->push_back(b);
    }
  } else {
    *out_boxes = CropBoxes(canvas_boxes, cw, ch, crop.rect);
  }
  // The crop, in the image's pixels: resized straight from the image when it lies inside it,
  // else drawn on a mean-coloured region first.
  const PixelRect& r = crop.rect;
  const PixelRect in_image{r.x - expand.left, r.y - expand.top, r.width, r.height};
  if (in_image.x >= 0 && in_image.y >= 0 && in_image.x + r.width <= w &&
      in_image.y + r.height <= h) {
    ResizeImage(*rgb, in_image, size, size, &resized_);
  } else {
    region_.Reshape(r.width, r.height, 3);
    cv::Mat region = MatOf(region_);
    region.setTo(cv::Scalar(std::lround(options_.mean[0] * 255),
                            std::lround(options_.mean[1] * 255),
                            std::lround(options_.mean[2] * 255)));
    const int x0 = std::max(0, in_image.x), y0 = std::max(0, in_image.y);
    const int x1 = std::min(w, in_image.x + r.width), y1 = std::min(h, in_image.y + r.height);
    if (x1 > x0 && y1 > y0) {
      MatOf (*rgb)(cv::Rect(x0, y0, x1 - x0, y1 - y0))
          .copyTo(region(cv::Rect(x0 - in_image.x, y0 - in_image.y, x1 - x0, y1 - y0)));
    }
    ResizeImage(region_, size, size, &resized_);
  }
  const ImageU8* result = &resized_;
  if (options_.flip && Draw(key, kFlip, 0) < 0.5) {
    FlipImage(resized_, &flipped_);
    FlipBoxes(out_boxes);
    result = &flipped_;
  }
  NormalizeImage(*result, PixelLayout::kRGB, options_.mean, options_.std, options_.channels_last,
                 planes_, out);
  return true;
}

}  // namespace cortado
