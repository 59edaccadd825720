// A test-only protobuf wire-format reader and writer, independent of libprotobuf and of
// data/datum.proto: it checks Cortado's records against caffe.proto's field numbers
// (channels 1, height 2, width 3, data 4, label 5, float_data 6, encoded 7), and writes
// records the way Caffe's own tools do (raw BGR pixels, encoded=false).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/error.h"

namespace cortado::testing {

struct WireField {
  int number = 0;
  int wire_type = 0;   // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  uint64_t value = 0;  // varint / fixed value
  std::string bytes;   // length-delimited payload
};

inline uint64_t ReadVarint(std::string_view s, size_t* pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    CORTADO_CHECK(*pos < s.size(), "wire: truncated varint");
    const uint8_t b = static_cast<uint8_t>(s[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  Fail("wire: varint too long");
}

inline std::vector<WireField> ParseWire(std::string_view s) {
  std::vector<WireField> fields;
  size_t pos = 0;
  while (pos < s.size()) {
    const uint64_t tag = ReadVarint(s, &pos);
    WireField f;
    f.number = static_cast<int>(tag >> 3);
    f.wire_type = static_cast<int>(tag & 7);
    switch (f.wire_type) {
      case 0:
        f.value = ReadVarint(s, &pos);
        break;
      case 1:
        CORTADO_CHECK(pos + 8 <= s.size(), "wire: truncated fixed64");
        std::memcpy(&f.value, s.data() + pos, 8);
        pos += 8;
        break;
      case 2: {
        const uint64_t len = ReadVarint(s, &pos);
        CORTADO_CHECK(pos + len <= s.size(), "wire: truncated bytes field");
        f.bytes.assign(s.data() + pos, len);
        pos += len;
        break;
      }
      case 5: {
        uint32_t v;
        CORTADO_CHECK(pos + 4 <= s.size(), "wire: truncated fixed32");
        std::memcpy(&v, s.data() + pos, 4);
        f.value = v;
        pos += 4;
        break;
      }
      default:
        Fail("wire: unsupported wire type ", f.wire_type);
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

inline void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

inline void PutVarintField(int number, uint64_t v, std::string* out) {
  PutVarint(static_cast<uint64_t>(number) << 3, out);
  PutVarint(v, out);
}

inline void PutBytesField(int number, std::string_view bytes, std::string* out) {
  PutVarint((static_cast<uint64_t>(number) << 3) | 2, out);
  PutVarint(bytes.size(), out);
  out->append(bytes);
}

inline void PutFloatField(int number, float f, std::string* out) {
  PutVarint((static_cast<uint64_t>(number) << 3) | 5, out);
  char b[4];
  std::memcpy(b, &f, 4);
  out->append(b, 4);
}

// A raw record as Caffe's convert_imageset writes it without --encoded: channel-major BGR.
inline std::string CaffeRawDatum(int channels, int height, int width, std::string_view chw_bgr,
                                 int label) {
  std::string out;
  PutVarintField(1, channels, &out);
  PutVarintField(2, height, &out);
  PutVarintField(3, width, &out);
  PutBytesField(4, chw_bgr, &out);
  PutVarintField(5, label, &out);
  return out;
}

}  // namespace cortado::testing
