// Image transforms of the ImageNet recipe, fused with decoding.
//
// Training: RandomResizedCrop (torchvision's algorithm: up to 10 tries at an area fraction in
// [scale_min, scale_max] and a log-uniform aspect ratio in [ratio_min, ratio_max], else a
// centre crop clamped to the ratio range), random horizontal flip, normalize. Validation: the
// centre crop that "resize the shorter side to val_resize, centre crop `crop`" selects,
// resized to crop x crop, normalize. Output: 3 x crop x crop float32 planes (CHW), RGB, or with
// channels_last the same values interleaved (HWC: crop x crop pixels of 3 channels); grey images
// are repeated to 3 channels.
//
// The crop rectangle is chosen from the JPEG header before decoding, so the decoder only
// decodes that rectangle, at the smallest DCT scale (1/8, 1/4, 1/2 or 1) that keeps it at
// least crop x crop pixels; the remaining downscale is bilinear (area averaging when it is
// more than 2x). Images that libjpeg-turbo cannot decode directly (CMYK/YCCK JPEGs, PNG and
// other formats in Caffe databases, raw Datum pixels) go through OpenCV at full size.
//
// Randomness is counter-based: the crop and flip of a sample are a function of a 64-bit key
// the caller derives from (seed, epoch, sample index), so any thread may transform any sample.
//
// Threads: an ImageTransformer holds per-thread decoder state and scratch buffers; each loader
// thread owns one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/image.h"
#include "data/jpeg.h"

namespace cortado {

struct TransformOptions {
  int crop = 224;                            // output side, training and validation
  int val_resize = 256;                      // validation: shorter side before the centre crop
  double scale_min = 0.08, scale_max = 1.0;  // RandomResizedCrop area fraction
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // RandomResizedCrop aspect ratio
  bool flip = true;  // training: horizontal flip with probability 1/2
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // RGB, in [0, 1] pixel units
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  // Use DCT-domain downscaling when the crop allows (off: always decode at full size).
  bool dct_scaling = true;
  // Write HWC (a channels-last net's layout) instead of CHW planes.
  bool channels_last = false;
};

// torchvision.transforms.RandomResizedCrop.get_params with uniforms drawn from `key`.
PixelRect RandomResizedCropRect(int width, int height, const TransformOptions& options,
                                uint64_t key);
// The region of a width x height image that Resize(val_resize) + CenterCrop(crop) keeps.
PixelRect CenterCropRect(int width, int height, const TransformOptions& options);
// Whether sample `key` is flipped.
bool FlipOf(uint64_t key);

enum class PixelLayout { kRGB, kBGR };

class ImageTransformer {
 public:
  explicit ImageTransformer(const TransformOptions& options);
  ~ImageTransformer();
  ImageTransformer(const ImageTransformer&) = delete;
  ImageTransformer& operator=(const ImageTransformer&) = delete;

  const TransformOptions& options() const { return options_; }

  // Transforms an encoded image (JPEG, or anything OpenCV reads) into out
  // (3 x crop x crop floats). train: RandomResizedCrop + flip from `key`; else the validation
  // transform. False when the image cannot be decoded; message() says why.
  bool Encoded(const uint8_t* data, size_t size, bool train, uint64_t key, float* out);
  // The same from pixels already decoded (1 or 3 channels, HWC; `layout` for 3 channels).
  bool Pixels(const ImageU8& image, PixelLayout layout, bool train, uint64_t key, float* out);

  const std::string& message() const { return message_; }
  // Decodes that took the DCT-scaled JPEG path / the OpenCV path, since construction.
  int64_t scaled_decodes() const { return scaled_decodes_; }
  int64_t fallback_decodes() const { return fallback_decodes_; }

 private:
  // Resizes `roi` of `image` to crop x crop, flips, normalizes into out.
  void Finish(const ImageU8& image, const PixelRect& roi, PixelLayout layout, bool flip,
              float* out);

  TransformOptions options_;
  JpegDecoder jpeg_;
  ImageU8 decoded_;
  ImageU8 resized_;
  ImageU8 flipped_;
  ImageU8 planes_[3];
  std::string message_;
  int64_t scaled_decodes_ = 0;
  int64_t fallback_decodes_ = 0;
};

// Decodes any image OpenCV reads (and every JPEG, CMYK and YCCK included) to RGB or grey
// pixels at full size; false if it does not decode. keep_gray: a grey image stays 1 channel.
bool DecodeWithOpenCV(const uint8_t* data, size_t size, bool keep_gray, ImageU8* out,
                      std::string* why);

// Resizes to exactly width x height: bilinear when shrinking by less than 2x per side; a
// larger shrink is bilinear to an integer multiple of the size, then a box filter (antialiased);
// bicubic when growing.
void ResizeImage(const ImageU8& in, int width, int height, ImageU8* out);
// The same for the region `roi` of `in`.
void ResizeImage(const ImageU8& in, const PixelRect& roi, int width, int height, ImageU8* out);

// Mirrors left to right.
void FlipImage(const ImageU8& in, ImageU8* out);

// An image (1 or 3 channels; `layout` for 3) to 3 float planes (CHW, RGB) of
// (v / 255 - mean) / std, or with `channels_last` the same values interleaved (HWC); a grey image
// is repeated to three. `scratch` holds the split planes.
void NormalizeImage(const ImageU8& image, PixelLayout layout, const std::array<float, 3>& mean,
                    const std::array<float, 3>& std, bool channels_last, ImageU8 (&scratch)[3],
                    float* out);

}  // namespace cortado
