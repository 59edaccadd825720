// SSD's data augmentation, boxes and pixels together (training), and the evaluation resize.
//
// Training, in the order of Caffe SSD's recipe and torchvision's detection reference ("ssd"
// preset), each step a function of a 64-bit key the caller derives from (seed, epoch, record):
//  1. photometric distortion (torchvision's RandomPhotometricDistort, on [0, 1] floats, clamped
//     after each step): brightness x U(0.875, 1.125), contrast (blend with the mean grey) and
//     saturation (blend with each pixel's grey) x U(0.5, 1.5), hue + U(-0.05, 0.05) turns, each
//     with probability 1/2, contrast before or after saturation and hue (1/2 each), then a
//     random permutation of the three channels with probability 1/2;
//  2. expand (zoom out), with probability 1/2: the image at a random place on a canvas
//     U(1, max_expand_ratio) times its width and height, filled with the mean colour;
//  3. the IoU-constrained random crop of SSD's batch sampler: seven samplers (the whole image,
//     a crop whose IoU with some object is at least 0.1, 0.3, 0.5, 0.7 or 0.9, an unconstrained
//     crop), each trying up to 50 crops of scale U(0.3, 1) and aspect ratio in [1/2, 2]; one
//     sampler that found a crop is picked uniformly. A crop must contain the centre of at least
//     one object (of one whose IoU with the crop meets the minimum); the objects whose centres
//     it contains are kept, clipped to it, the others dropped;
//  4. horizontal flip with probability 1/2;
//  5. resize to size x size (aspect not kept, as SSD's), normalize to 3 float planes (CHW, RGB).
// Crops and canvases are whole pixels, and boxes are moved with exactly the integer offsets the
// pixels are, so a box encloses the same pixels before and after (up to resampling).
//
// Evaluation: the whole image resized to size x size; boxes as they are (difficult ones too).
//
// A large JPEG is decoded at a DCT scale (1/2, 1/4, 1/8) that keeps at least the output's
// resolution in the smallest crop (boxes are normalized, so nothing else changes).
//
// Boxes are normalized to the image (data/annotated_datum.h). A box left with no area is dropped.
// Threads: a DetectionTransformer holds scratch images; each loader thread owns one.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/annotated_datum.h"
#include "data/image.h"
#include "data/jpeg.h"
#include "data/transforms.h"

namespace cortado {

struct DetectionTransformOptions {
  int size = 300;                 // output width and height
  bool distort = true;            // training: photometric distortion
  bool expand = true;             // training: zoom out onto a mean-coloured canvas
  double max_expand_ratio = 4.0;  // canvas side / image side, at most
  bool iou_crop = true;           // training: SSD's IoU-constrained random crop
  bool flip = true;               // training: horizontal flip with probability 1/2
  // RGB, in [0, 1] pixel units; torchvision's ssd300_vgg16: the mean of Caffe SSD's
  // (123, 117, 104) and std 1/255, so the net sees 0..255 pixels minus the mean.
  std::array<float, 3> mean = {0.48235f, 0.45882f, 0.40784f};
  std::array<float, 3> std = {1.0f / 255, 1.0f / 255, 1.0f / 255};
  bool channels_last = false;  // write HWC (the net's layout is nhwc), else CHW
};

// The minimum IoUs of SSD's constrained samplers.
inline constexpr double kSsdMinIous[] = {0.1, 0.3, 0.5, 0.7, 0.9};

// Where the image lies on the expanded canvas (the image itself when not expanded).
struct ExpandPlan {
  int canvas_width = 0, canvas_height = 0;
  int left = 0, top = 0;
};
ExpandPlan PlanExpand(int width, int height, const DetectionTransformOptions& options,
                      uint64_t key);

// A crop of SSD's batch sampler, in pixels of a width x height image whose objects are `boxes`
// (normalized): `min_iou` is the sampled constraint, 0 for the unconstrained sampler, -1 for the
// whole image.
struct CropPlan {
  PixelRect rect;
  double min_iou = -1;
};
CropPlan SampleCrop(int width, int height, const std::vector<BoxAnnotation>& boxes, uint64_t key);

// Boxes (normalized to a width x height image) as they lie on the expanded canvas of `plan`.
std::vector<BoxAnnotation> ExpandBoxes(const std::vector<BoxAnnotation>& boxes, int width,
                                       int height, const ExpandPlan& plan);
// The boxes whose centres lie inside `crop` (pixels of a width x height image), normalized to
// the crop and clipped to it.
std::vector<BoxAnnotation> CropBoxes(const std::vector<BoxAnnotation>& boxes, int width, int height,
                                     const PixelRect& crop);
// Mirrors boxes left to right.
void FlipBoxes(std::vector<BoxAnnotation>* boxes);

// IoU of two boxes given as (xmin, ymin, xmax, ymax) in the same units.
double BoxIou(const std::array<double, 4>& a, const std::array<double, 4>& b);

// Step 1 on an RGB image, in place.
void PhotometricDistort(ImageU8* image, uint64_t key);

class DetectionTransformer {
 public:
  explicit DetectionTransformer(const DetectionTransformOptions& options);
  ~DetectionTransformer();
  DetectionTransformer(const DetectionTransformer&) = delete;
  DetectionTransformer& operator=(const DetectionTransformer&) = delete;

  const DetectionTransformOptions& options() const { return options_; }

  // Decodes an encoded image (JPEG, or anything OpenCV reads), transforms it into `out`
  // (3 x size x size floats) and its boxes into *out_boxes: augmented from `key` when `train`,
  // else resized. False when the image does not decode; message() says why.
  bool Encoded(const uint8_t* data, size_t size, const std::vector<BoxAnnotation>& boxes,
               bool train, uint64_t key, float* out, std::vector<BoxAnnotation>* out_boxes);
  // The same from decoded pixels (1 or 3 channels, HWC, RGB).
  bool Pixels(const ImageU8& image, const std::vector<BoxAnnotation>& boxes, bool train,
              uint64_t key, float* out, std::vector<BoxAnnotation>* out_boxes);

  const std::string& message() const { return message_; }
  // The DCT scale (k of k/8) the last JPEG was decoded at; 8 for other images.
  int last_dct_scale() const { return last_dct_scale_; }
  // The last image's width and height as it came (before decoding at a DCT scale).
  int source_width() const { return source_width_; }
  int source_height() const { return source_height_; }

 private:
  DetectionTransformOptions options_;
  int last_dct_scale_ = 8;
  int source_width_ = 0, source_height_ = 0;
  JpegDecoder jpeg_;
  ImageU8 decoded_;
  ImageU8 rgb_;
  ImageU8 region_;
  ImageU8 resized_;
  ImageU8 flipped_;
  ImageU8 planes_[3];
  std::string message_;
};

}  // namespace cortado
