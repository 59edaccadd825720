#include "data/datum.h"

#include <algorithm>
#include <cmath>

#include "data/datum.pb.h"
#include "engine/base/error.h"

namespace cortado {

struct DatumParser::Impl {
  caffe::Datum message;
};

std::string SerializeDatum(const DatumFields& fields, std::string_view data) {
  caffe::Datum datum;
  datum.set_channels(fields.channels);
  datum.set_height(fields.height);
  datum.set_width(fields.width);
  datum.set_data(data.data(), data.size());
  datum.set_label(fields.label);
  datum.set_encoded(fields.encoded);
  std::string out;
  CORTADO_CHECK(datum.SerializeToString(&out), "cannot serialize a Datum");
  return out;
}

DatumParser::DatumParser() : impl_(std::make_unique<Impl>()) {}
DatumParser::~DatumParser() = default;

bool DatumParser::Parse(const void* bytes, size_t size) {
  caffe::Datum& m = impl_->message;
  if (size > static_cast<size_t>(INT32_MAX) || !m.ParseFromArray(bytes, static_cast<int>(size))) {
    fields_ = DatumFields{};
    return false;
  }
  fields_.channels = m.channels();
  fields_.height = m.height();
  fields_.width = m.width();
  fields_.label = m.label();
  fields_.encoded = m.encoded();
  return true;
}

std::string_view DatumParser::data() const { return impl_->message.data(); }
size_t DatumParser::float_count() const { return impl_->message.float_data_size(); }
const float* DatumParser::float_data() const { return impl_->message.float_data().data(); }

bool DatumParser::RawPixels(ImageU8* out, std::string* why) const {
  return RawDatumPixels(fields_, data(), float_data(), float_count(), out, why);
}

bool RawDatumPixels(const DatumFields& fields, std::string_view bytes, const float* floats,
                    size_t float_count, ImageU8* out, std::string* why) {
  const int c = fields.channels, h = fields.height, w = fields.width;
  if ((c != 1 && c != 3) || h <= 0 || w <= 0) {
    *why = StrCat("raw Datum with shape ", c, "x", h, "x", w, " (want 1 or 3 channels)");
    return false;
  }
  const size_t plane = static_cast<size_t>(h) * w;
  const size_t need = plane * c;
  const bool use_bytes = !bytes.empty();
  if (use_bytes ? bytes.size() != need : float_count != need) {
    *why = StrCat("raw Datum ", c, "x", h, "x", w, " holds ",
                  use_bytes ? bytes.size() : float_count, " values, want ", need);
    return false;
  }
  out->Reshape(w, h, c);
  // Caffe stores channel-major BGR; we want interleaved RGB.
  for (int oc = 0; oc < c; ++oc) {
    const size_t ic = c == 3 ? 2 - oc : 0;
    uint8_t* dst = out->pixels.data() + oc;
    if (use_bytes) {
      const auto* src = reinterpret_cast<const uint8_t*>(bytes.data()) + ic * plane;
      for (size_t i = 0; i < plane; ++i) dst[i * c] = src[i];
    } else {
      const float* src = floats + ic * plane;
      for (size_t i = 0; i < plane; ++i) {
        dst[i * c] = static_cast<uint8_t>(std::clamp(std::lround(src[i]), 0L, 255L));
      }
    }
  }
  return true;
}

}  // namespace cortado
