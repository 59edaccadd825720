// Datum: Caffe's record for one labelled image, as stored in LMDB (see data/datum.proto).
//
// An encoded record holds a compressed image (Cortado writes JPEG); a raw one holds
// channels x height x width uint8 pixels in BGR channel order (Caffe's convention) or the same
// as float_data. DatumParser reuses one message between records, so parsing a database record
// allocates nothing once its buffers have grown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "data/image.h"

namespace cortado {

struct DatumFields {
  int channels = 0;
  int height = 0;
  int width = 0;
  int label = 0;
  bool encoded = false;
};

// Serializes a Datum with the given bytes in `data`.
std::string SerializeDatum(const DatumFields& fields, std::string_view data);

// A raw record's pixels (`bytes`, or else `floats`: channels x height x width, BGR planes) as
// HWC, RGB (3 channels) or grey (1 channel). False, with *why, when the sizes do not add up.
// Shared by DatumParser and AnnotatedDatumParser (data/annotated_datum.h).
bool RawDatumPixels(const DatumFields& fields, std::string_view bytes, const float* floats,
                    size_t float_count, ImageU8* out, std::string* why);

class DatumParser {
 public:
  DatumParser();
  ~DatumParser();
  DatumParser(const DatumParser&) = delete;
  DatumParser& operator=(const DatumParser&) = delete;

  // False when the bytes are not a Datum.
  bool Parse(const void* bytes, size_t size);
  const DatumFields& fields() const { return fields_; }
  // The `data` field (encoded image or raw uint8 pixels).
  std::string_view data() const;
  size_t float_count() const;
  const float* float_data() const;

  // For a raw record: its pixels as HWC, RGB (3 channels) or grey (1 channel). False, with
  // *why, when the sizes do not add up.
  bool RawPixels(ImageU8* out, std::string* why) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DatumFields fields_;
};

}  // namespace cortado
