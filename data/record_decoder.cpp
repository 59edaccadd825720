#include "data/record_decoder.h"

namespace cortado {

bool RecordDecoder::Decode(std::string_view record, bool train, uint64_t key, float* image,
                           int32_t* label) {
  why_.clear();
  if (!parser_.Parse(record.data(), record.size())) {
    why_ = "not a Datum record";
    return false;
  }
  const DatumFields& f = parser_.fields();
  bool ok;
  if (f.encoded) {
    const std::string_view bytes = parser_.data();
    ok = transformer_.Encoded(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), train,
                              key, image);
    if (!ok) why_ = transformer_.message();
  } else {
    ok = parser_.RawPixels(&raw_, &why_) &&
         transformer_.Pixels(raw_, PixelLayout::kRGB, train, key, image);
    if (!ok && why_.empty()) why_ = transformer_.message();
  }
  if (ok) *label = f.label;
  return ok;
}

bool DetectionDecoder::Decode(std::string_view record, bool train, uint64_t key, float* image,
                              std::vector<float>* rows) {
  why_.clear();
  if (!parser_.Parse(record.data(), record.size(), &why_)) return false;
  bool ok;
  if (parser_.fields().encoded) {
    const std::string_view bytes = parser_.data();
    ok = transformer_.Encoded(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                              parser_.boxes(), train, key, image, &boxes_);
    if (!ok) why_ = transformer_.message();
  } else {
    ok = parser_.RawPixels(&raw_, &why_) &&
         transformer_.Pixels(raw_, parser_.boxes(), train, key, image, &boxes_);
    if (!ok && why_.empty()) why_ = transformer_.message();
  }
  if (!ok) return false;
  rows->clear();
  for (const BoxAnnotation& b : boxes_) {
    rows->insert(rows->end(), {static_cast<float>(b.label), static_cast<float>(b.instance_id),
                               b.xmin, b.ymin, b.xmax, b.ymax, b.difficult ? 1.0f : 0.0f});
  }
  return true;
}

}  // namespace cortado
