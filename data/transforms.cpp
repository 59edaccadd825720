#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <opencv2/core.hpp>
#ifdef CORTADO_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#endif
#include <opencv2/imgproc.hpp>

#include "engine/base/error.h"
#include "engine/base/random.h"

namespace cortado {
namespace {

double Uniform(uint64_t key, uint64_t draw) { return KeyToUniform(HashCombine(key, draw)); }

cv::Mat MatOf(const ImageU8& image) {
  return cv::Mat(image.height, image.width, CV_8UC(image.channels),
                 const_cast<uint8_t*>(image.pixels.data()), image.stride());
}

// Parallelism comes from the loader's and the converter's threads, each working on its own
// images; OpenCV's own thread pool (TBB on Debian) inside them would only oversubscribe the
// thread budget (in `cortado convert --threads 1` it spent 14% of the CPU time on handing work
// to TBB threads). Process-wide; data/ is Cortado's only user of OpenCV.
void KeepOpenCVOnTheCallingThread() {
  static std::once_flag once;
  std::call_once(once, [] { cv::setNumThreads(0); });
}

// Resizes src into dst (already sized). Shrinking by at most 2x per side is bilinear, which
// reads every source pixel there and so does not alias. A larger shrink is antialiased in two
// steps: bilinear to an exact integer multiple of the target (less than 2x away), then OpenCV's
// integer-ratio area average, a plain box filter; OpenCV's area averaging at an odd ratio
// gives about the same pixels but took 4-5x as long (47% of `cortado convert --resize` time).
// Growing is bicubic.
void ResizeInto(const cv::Mat& src, cv::Mat& dst) {
  KeepOpenCVOnTheCallingThread();
  const int w = dst.cols, h = dst.rows;
  const int fx = std::max(1, src.cols / w), fy = std::max(1, src.rows / h);
  if (fx > 1 || fy > 1) {
    cv::Mat multiple;
    cv::resize(src, multiple, cv::Size(w * fx, h * fy), 0, 0, cv::INTER_LINEAR);
    cv::resize(multiple, dst, dst.size(), 0, 0, cv::INTER_AREA);
  } else {
    const bool shrink = w < src.cols || h < src.rows;
    cv::resize(src, dst, dst.size(), 0, 0, shrink ? cv::INTER_LINEAR : cv::INTER_CUBIC);
  }
}

}  // namespace

PixelRect RandomResizedCropRect(int width, int height, const TransformOptions& o, uint64_t key) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const uint64_t base = 4 * static_cast<uint64_t>(attempt);
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * Uniform(key, base));
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * Uniform(key, base + 1));
    const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int y = static_cast<int>(Uniform(key, base + 2) * (height - h + 1));
      const int x = static_cast<int>(Uniform(key, base + 3) * (width - w + 1));
      return PixelRect{std::min(x, width - w), std::min(y, height - h), w, h};
    }
  }
  // Fallback: centre crop at the nearest allowed aspect ratio.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = std::clamp(static_cast<int>(std::lround(w / o.ratio_min)), 1, height);
  } else if (in_ratio > o.ratio_max) {
    w = std::clamp(static_cast<int>(std::lround(h * o.ratio_max)), 1, width);
  }
  return PixelRect{(width - w) / 2, (height - h) / 2, w, h};
}

PixelRect CenterCropRect(int width, int height, const TransformOptions& o) {
  // torchvision Resize(val_resize): the shorter side becomes val_resize, the longer one
  // int(val_resize * long / short); CenterCrop(crop) then starts at round((side - crop) / 2).
  const bool wide = width > height;
  const int shorter = wide ? height : width, longer = wide ? width : height;
  const int new_short = o.val_resize;
  const int new_long = static_cast<int>(static_cast<int64_t>(o.val_resize) * longer / shorter);
  const int new_w = wide ? new_long : new_short, new_h = wide ? new_short : new_long;
  const double fx = static_cast<double>(width) / new_w, fy = static_cast<double>(height) / new_h;
  const int crop_w = std::min(o.crop, new_w), crop_h = std::min(o.crop, new_h);
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  const double left = std::nearbyint((new_w - crop_w) / 2.0);
  const double top = std::nearbyint((new_h - crop_h) / 2.0);
  PixelRect r;
  r.x = static_cast<int>(std::lround(left * fx));
  r.y = static_cast<int>(std::lround(top * fy));
  r.width = std::clamp(static_cast<int>(std::lround(crop_w * fx)), 1, width - r.x);
  r.height = std::clamp(static_cast<int>(std::lround(crop_h * fy)), 1, height - r.y);
  return r;
}

bool FlipOf(uint64_t key) { return Uniform(key, 0x464c4950) < 0.5; }

ImageTransformer::ImageTransformer(const TransformOptions& options) : options_(options) {
  KeepOpenCVOnTheCallingThread();
  CORTADO_CHECK(options.crop > 0, "crop size must be positive, got ", options.crop);
  CORTADO_CHECK(options.val_resize >= options.crop, "val_resize (", options.val_resize,
                ") must be at least the crop size (", options.crop, ")");
  CORTADO_CHECK(
      options.scale_min > 0 && options.scale_min <= options.scale_max && options.scale_max <= 1.0,
      "RandomResizedCrop scale range must satisfy 0 < scale_min <= scale_max <= 1, got [",
      options.scale_min, ", ", options.scale_max, "]");
  CORTADO_CHECK(options.ratio_min > 0 && options.ratio_min <= options.ratio_max,
                "RandomResizedCrop ratio range must satisfy 0 < ratio_min <= ratio_max, got [",
                options.ratio_min, ", ", options.ratio_max, "]");
  for (int c = 0; c < 3; ++c) {
    CORTADO_CHECK(options.std[c] > 0, "normalization std must be positive, channel ", c, " has ",
                  options.std[c]);
  }
}

ImageTransformer::~ImageTransformer() = default;

bool ImageTransformer::Encoded(const uint8_t* data, size_t size, bool train, uint64_t key,
                               float* out) {
  message_.clear();
  JpegHeader header;
  if (jpeg_.Open(data, size, &header) && header.color != JpegColor::kCMYK &&
      header.color != JpegColor::kYCCK && header.color != JpegColor::kUnknown) {
    const PixelRect rect = train ? RandomResizedCropRect(header.width, header.height, options_, key)
                                 : CenterCropRect(header.width, header.height, options_);
    const int k = options_.dct_scaling
                      ? ChooseDctScale(rect.width, rect.height, options_.crop, options_.crop)
                      : 8;
    PixelRect roi;
    if (!jpeg_.Decode(k, rect, &decoded_, &roi)) {
      message_ = jpeg_.message();
      return false;
    }
    ++scaled_decodes_;
    Finish(decoded_, roi, PixelLayout::kRGB, train && options_.flip && FlipOf(key), out);
    return true;
  }
  // Not a JPEG libjpeg-turbo decodes to RGB directly: let OpenCV try every format it knows.
  std::string why;
  if (!DecodeWithOpenCV(data, size, /*keep_gray=*/true, &decoded_, &why)) {
    message_ = jpeg_.message().empty() ? why : jpeg_.message();
    return false;
  }
  ++fallback_decodes_;
  const bool flip = train && options_.flip && FlipOf(key);
  const PixelRect rect = train
                             ? RandomResizedCropRect(decoded_.width, decoded_.height, options_, key)
                             : CenterCropRect(decoded_.width, decoded_.height, options_);
  Finish(decoded_, rect, PixelLayout::kRGB, flip, out);
  return true;
}

bool ImageTransformer::Pixels(const ImageU8& image, PixelLayout layout, bool train, uint64_t key,
                              float* out) {
  message_.clear();
  if (image.width <= 0 || image.height <= 0 || (image.channels != 1 && image.channels != 3)) {
    message_ = StrCat("bad raw image ", image.width, "x", image.height, "x", image.channels);
    return false;
  }
  const PixelRect rect = train ? RandomResizedCropRect(image.width, image.height, options_, key)
                               : CenterCropRect(image.width, image.height, options_);
  Finish(image, rect, layout, train && options_.flip && FlipOf(key), out);
  return true;
}

void ImageTransformer::Finish(const ImageU8& image, const PixelRect& roi, PixelLayout layout,
                              bool flip, float* out) {
  const int crop = options_.crop;
  const int c = image.channels;
  cv::Mat src = MatOf(image)(cv::Rect(roi.x, roi.y, roi.width, roi.height));
  resized_.Reshape(crop, crop, c);
  cv::Mat dst = MatOf(resized_);
  // DCT scaling leaves less than 2x to shrink except for very large images (ResizeInto).
  ResizeInto(src, dst);
  const ImageU8* result = &resized_;
  if (flip) {
    FlipImage(resized_, &flipped_);
    result = &flipped_;
  }
  NormalizeImage(*result, layout, options_.mean, options_.std, options_.channels_last, planes_,
                 out);
}

void NormalizeImage(const ImageU8& image, PixelLayout layout, const std::array<float, 3>& mean,
                    const std::array<float, 3>& std, bool channels_last, ImageU8 (&scratch)[3],
                    float* out) {
  const int w = image.width, h = image.height, c = image.channels;
  const cv::Mat src = MatOf(image);
  if (channels_last) {
    // Interleaved as decoded: one pass from the u8 pixels, (v / 255 - mean) / std per channel.
    float alpha[3], beta[3];
    for (int oc = 0; oc < 3; ++oc) {
      alpha[oc] = static_cast<float>(1.0 / (255.0 * std[oc]));
      beta[oc] = static_cast<float>(-mean[oc] / std[oc]);
    }
    int from[3] = {0, 0, 0};  // the source channel of each output channel
    if (c == 3) {
      for (int oc = 0; oc < 3; ++oc) from[oc] = layout == PixelLayout::kBGR ? 2 - oc : oc;
    }
    for (int y = 0; y < h; ++y) {
      const uint8_t* row = src.ptr<uint8_t>(y);
      float* o = out + static_cast<size_t>(y) * w * 3;
      for (int x = 0; x < w; ++x) {
        for (int oc = 0; oc < 3; ++oc) {
          o[x * 3 + oc] = static_cast<float>(row[x * c + from[oc]]) * alpha[oc] + beta[oc];
        }
      }
    }
    return;
  }
  cv::Mat planes[3];
  if (c == 3) {
    for (int i = 0; i < 3; ++i) {
      scratch[i].Reshape(w, h, 1);
      planes[i] = MatOf(scratch[i]);
    }
    cv::split(src, planes);  // into our buffers: sizes match, so nothing is allocated
  } else {
    planes[0] = planes[1] = planes[2] = src;
  }
  const size_t plane_size = static_cast<size_t>(w) * h;
  for (int oc = 0; oc < 3; ++oc) {
    const int ic = (c == 3 && layout == PixelLayout::kBGR) ? 2 - oc : oc;
    cv::Mat target(h, w, CV_32F, out + oc * plane_size);
    // (v / 255 - mean) / std == v * alpha + beta
    const double alpha = 1.0 / (255.0 * std[oc]);
    const double beta = -mean[oc] / std[oc];
    planes[ic].convertTo(target, CV_32F, alpha, beta);
  }
}

void FlipImage(const ImageU8& in, ImageU8* out) {
  out->Reshape(in.width, in.height, in.channels);
  cv::Mat dst = MatOf(*out);
  cv::flip(MatOf(in), dst, 1);
}

bool DecodeWithOpenCV(const uint8_t* data, size_t size, bool keep_gray, ImageU8* out,
                      std::string* why) {
  KeepOpenCVOnTheCallingThread();
  if (size == 0) {
    *why = "empty input";
    return false;
  }
#ifndef CORTADO_IMAGE_CODECS
  *why =
      "not a JPEG, and this build decodes only JPEG (configured with -DCORTADO_IMAGE_CODECS=OFF)";
  return false;
#else
  cv::Mat img;
  try {
    // EXIF orientation is ignored, as PIL/torchvision and the libjpeg path do.
    const int flags =
        (keep_gray ? cv::IMREAD_ANYCOLOR : cv::IMREAD_COLOR) | cv::IMREAD_IGNORE_ORIENTATION;
    img =
        cv::imdecode(cv::Mat(1, static_cast<int>(size), CV_8U, const_cast<uint8_t*>(data)), flags);
  } catch (const cv::Exception& e) {
    *why = StrCat("OpenCV: ", e.what());
    return false;
  }
  if (img.empty()) {
    *why = "not an image format OpenCV or libjpeg can decode";
    return false;
  }
  if (img.depth() != CV_8U) {
    cv::Mat eight;
    img.convertTo(eight, CV_8U, img.depth() == CV_16U ? 1.0 / 257.0 : 1.0);
    img = eight;
  }
  cv::Mat rgb;
  switch (img.channels()) {
    case 1:
      rgb = img;
      break;
    case 3:
      cv::cvtColor(img, rgb, cv::COLOR_BGR2RGB);
      break;
    case 4:
      cv::cvtColor(img, rgb, cv::COLOR_BGRA2RGB);
      break;
    default:
      *why = StrCat("unsupported channel count ", img.channels());
      return false;
  }
  out->Reshape(rgb.cols, rgb.rows, rgb.channels());
  cv::Mat dst = MatOf(*out);
  rgb.copyTo(dst);
  return true;
#endif
}

void ResizeImage(const ImageU8& in, int width, int height, ImageU8* out) {
  ResizeImage(in, PixelRect{0, 0, in.width, in.height}, width, height, out);
}

void ResizeImage(const ImageU8& in, const PixelRect& roi, int width, int height, ImageU8* out) {
  CORTADO_CHECK(width > 0 && height > 0, "resize to ", width, "x", height);
  CORTADO_CHECK(roi.x >= 0 && roi.y >= 0 && roi.width > 0 && roi.height > 0 &&
                    roi.x + roi.width <= in.width && roi.y + roi.height <= in.height,
                "resize: region ", roi.width, "x", roi.height, "+", roi.x, "+", roi.y,
                " is not inside the ", in.width, "x", in.height, " image");
  out->Reshape(width, height, in.channels);
  cv::Mat dst = MatOf(*out);
  ResizeInto(MatOf(in)(cv::Rect(roi.x, roi.y, roi.width, roi.height)), dst);
}

}  // namespace cortado
