// RecordDecoder: one database record (a serialized Caffe Datum) to a training sample. Parses
// the Datum, then decodes its encoded image or takes its raw pixels, then transforms them
// (crop, flip, normalize; data/transforms.h) into 3 x crop x crop floats. What the LMDB
// sources' loader threads run per record, one decoder per thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "data/datum.h"
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

}  // namespace cortado
