// JPEG decode and encode with libjpeg-turbo.
//
// JpegDecoder wraps libjpeg's decompressor (the libjpeg API of libjpeg-turbo, because the
// TurboJPEG 2.x API cannot decode a region): Open parses the header, then Decode produces one
// rectangle of the image at a DCT-domain scale of k/8. Scaling in the DCT domain skips most of
// the inverse DCT work (and is itself a good low-pass filter), and decoding a region skips the
// colour conversion and upsampling of the columns outside it and stops after its last row, so a
// RandomResizedCrop of a 500x375 photo to 224x224 costs a fraction of a full decode.
//
// Corrupt data: libjpeg's fatal errors make Open/Decode return false with message(); its
// warnings (premature end of data, corrupt entropy data) are counted and the image decodes with
// what was there (libjpeg fills the missing part with grey), as PIL and OpenCV also do.
//
// JpegEncoder wraps TurboJPEG's compressor (baseline or progressive, 4:2:0 or grey).
//
// Threads: a decoder or encoder is used by one thread at a time; each loader thread owns one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "data/image.h"

namespace cortado {

enum class JpegColor { kGray, kYCbCr, kRGB, kCMYK, kYCCK, kUnknown };
const char* JpegColorName(JpegColor color);

struct JpegHeader {
  int width = 0;
  int height = 0;
  int components = 0;  // 1, 3 or 4
  JpegColor color = JpegColor::kUnknown;
  bool progressive = false;
};

// A rectangle of pixels: [x, x + width) x [y, y + height).
struct PixelRect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

// True when the buffer starts with a JPEG SOI marker (FF D8 FF).
bool LooksLikeJpeg(const uint8_t* data, size_t size);

// The smallest DCT scale k (image scaled by k/8, k in 1..8) that keeps a region of
// region_w x region_h full-resolution pixels at least need_w x need_h pixels large, among the
// scales whose inverse DCT libjpeg-turbo runs with SIMD (1/8, 1/4, 1/2, 1): the other k/8 use
// plain C IDCTs that are slower than the SIMD full-size one (measured, see data/README.md).
int ChooseDctScale(int region_w, int region_h, int need_w, int need_h);

// Size of an image dimension after scaling by k/8, as libjpeg computes it (rounded up).
inline int ScaledDim(int full, int k) { return static_cast<int>((int64_t{full} * k + 7) / 8); }

class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Parses the header of `data` (which must stay alive until Decode returns). False when it
  // is not a JPEG or the header is broken; message() says why.
  bool Open(const uint8_t* data, size_t size, JpegHeader* header);

  // Decodes `region` (full-resolution pixels) of the opened image at scale k/8 into `out`:
  // RGB for colour images, one channel for grey ones (CMYK and YCCK are refused: use
  // OpenCV for them). Region edges are rounded outward to scaled pixels and column edges
  // further out to the iMCU grid, so `out` may be wider than asked: *roi receives where the
  // scaled region lies inside `out`. False on a fatal decode error (message()).
  bool Decode(int k, const PixelRect& region, ImageU8* out, PixelRect* roi);

  // Convenience: Open + Decode of the whole image at full size.
  bool DecodeFull(const uint8_t* data, size_t size, ImageU8* out);

  // Warnings (corrupt or truncated data) met since the last Open.
  int warnings() const;
  // The fatal error, else the first warning, since the last Open.
  const std::string& message() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class JpegEncoder {
 public:
  JpegEncoder();
  ~JpegEncoder();
  JpegEncoder(const JpegEncoder&) = delete;
  JpegEncoder& operator=(const JpegEncoder&) = delete;

  // Compresses an RGB (4:2:0) or grey image at quality 1..100 and appends nothing: `out` is
  // replaced. Throws cortado::Error on failure (which only a bad argument can cause).
  void Encode(const ImageU8& image, int quality, bool progressive, std::string* out);

 private:
  void* handle_ = nullptr;  // tjhandle
};

}  // namespace cortado
