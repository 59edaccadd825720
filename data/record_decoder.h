// RecordDecoder: one database record (a serialized Caffe Datum) to a training sample. Parses
// the Datum, then decodes its encoded image or takes its raw pixels, then transforms them
// (crop, flip, normalize; data/transforms.h) into 3 x crop x crop floats. What the LMDB
// sources' loader threads run per record, one decoder per thread.
//
// DetectionDecoder: the same for a Caffe SSD AnnotatedDatum record (data/annotated_datum.h):
// the image and its objects through SSD's augmentation (data/detection_transforms.h) into
// 3 x size x size floats and rows of kBoxRowWidth floats, one per object that survived it:
// [class_label, instance_id, xmin, ymin, xmax, ymax, difficult] (the loader prefixes the
// item_id of Batch::boxes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/annotated_datum.h"
#include "data/datum.h"
#include "data/detection_transforms.h"
#include "data/image.h"
#include "data/transforms.h"

namespace cortado {

class RecordDecoder {
 public:
  explicit RecordDecoder(const TransformOptions& options) : transformer_(options) {}

  // False, with why(), when the record is corrupt: not a Datum, an image that does not
  // decode, pixel counts that do not add up. *label is the record's label, not range-checked.
  bool Decode(std::string_view record, bool train, uint64_t key, float* image, int32_t* label);
  const std::string& why() const { return why_; }

 private:
  DatumParser parser_;
  ImageTransformer transformer_;
  ImageU8 raw_;
  std::string why_;
};

// Floats per object row a DetectionDecoder produces.
inline constexpr int kBoxRowWidth = 7;

class DetectionDecoder {
 public:
  explicit DetectionDecoder(const DetectionTransformOptions& options) : transformer_(options) {}

  // False, with why(), when the record is corrupt (not an AnnotatedDatum, a box that is not one,
  // an image that does not decode). Else *rows holds the objects after augmentation (train) or
  // as recorded (evaluation); record_boxes() those of the record, for label checks.
  bool Decode(std::string_view record, bool train, uint64_t key, float* image,
              std::vector<float>* rows);
  const std::vector<BoxAnnotation>& record_boxes() const { return parser_.boxes(); }
  // The last decoded image's width and height as stored in its record.
  int image_width() const { return transformer_.source_width(); }
  int image_height() const { return transformer_.source_height(); }
  const std::string& why() const { return why_; }

 private:
  AnnotatedDatumParser parser_;
  DetectionTransformer transformer_;
  ImageU8 raw_;
  std::vector<BoxAnnotation> boxes_;
  std::string why_;
};

}  // namespace cortado
