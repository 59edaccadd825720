// AnnotatedDatum: Caffe SSD's detection record (data/datum.proto), a Datum holding the image
// plus the image's objects, grouped by class label, each a box normalized to [0, 1] of the
// image's width and height with a `difficult` flag and its instance number within its group.
// `cortado convert` writes them for Pascal VOC and COCO; Caffe SSD's convert_annoset writes the
// same, so either tool's LMDBs train in the other.
//
// Box coordinates are continuous: x = 0 is the left edge of the first pixel column, x = 1 the
// right edge of the last. A record's boxes are not range-checked here beyond being finite and
// ordered (xmin <= xmax, ymin <= ymax); the transforms clip them.
//
// AnnotatedDatumParser reuses one message between records, as DatumParser does. One parser per
// thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/datum.h"
#include "data/image.h"

namespace cortado {

struct BoxAnnotation {
  int label = 0;        // the class, 1..K (0 is the background, never an object)
  int instance_id = 0;  // its number among the image's objects of the same class (0, 1, ...)
  float xmin = 0, ymin = 0, xmax = 0, ymax = 0;  // normalized to the image
  bool difficult = false;
};

// Serializes an AnnotatedDatum (type BBOX) whose datum holds `fields` and `data`. Boxes are
// grouped by label in the order each label first appears, keeping their order within a group,
// as Caffe SSD's convert_annoset groups them; their instance ids are written as given.
std::string SerializeAnnotatedDatum(const DatumFields& fields, std::string_view data,
                                    const std::vector<BoxAnnotation>& boxes);

class AnnotatedDatumParser {
 public:
  AnnotatedDatumParser();
  ~AnnotatedDatumParser();
  AnnotatedDatumParser(const AnnotatedDatumParser&) = delete;
  AnnotatedDatumParser& operator=(const AnnotatedDatumParser&) = delete;

  // False, with *why, when the bytes are not an AnnotatedDatum with an image (a classification
  // Datum parses as one without), or a box is not finite or not ordered.
  bool Parse(const void* bytes, size_t size, std::string* why);
  // The image's Datum fields (Caffe SSD leaves the Datum's label at -1).
  const DatumFields& fields() const { return fields_; }
  // The image: encoded bytes, or raw uint8 pixels.
  std::string_view data() const;
  // For a raw record: its pixels as HWC, RGB or grey (see RawDatumPixels).
  bool RawPixels(ImageU8* out, std::string* why) const;
  // The objects, group by group (label from the group's group_label).
  const std::vector<BoxAnnotation>& boxes() const { return boxes_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DatumFields fields_;
  std::vector<BoxAnnotation> boxes_;
};

}  // namespace cortado
