#include "data/jpeg.h"

#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "engine/base/error.h"

namespace cortado {

const char* JpegColorName(JpegColor color) {
  switch (color) {
    case JpegColor::kGray:
      return "grayscale";
    case JpegColor::kYCbCr:
      return "YCbCr";
    case JpegColor::kRGB:
      return "RGB";
    case JpegColor::kCMYK:
      return "CMYK";
    case JpegColor::kYCCK:
      return "YCCK";
    case JpegColor::kUnknown:
      break;
  }
  return "unknown";
}

bool LooksLikeJpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

int ChooseDctScale(int region_w, int region_h, int need_w, int need_h) {
  // 1/8, 1/4, 1/2 and 1 have SIMD inverse DCTs in libjpeg-turbo; see the header.
  for (int k : {1, 2, 4}) {
    // The scaled region spans at least floor(region * k / 8) pixels.
    if (int64_t{region_w} * k / 8 >= need_w && int64_t{region_h} * k / 8 >= need_h) return k;
  }
  return 8;
}

namespace {

// libjpeg reports errors through callbacks: a fatal one must not return, so it longjmps back
// to the setjmp in the public method that called into libjpeg. Those methods keep no C++
// objects with destructors alive across the libjpeg calls.
struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  int warnings = 0;
  std::string message;
};

void OnFatal(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  err->message = text;
  longjmp(err->jump, 1);
}

void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (err->warnings == 0) {
    char text[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, text);
    err->message = text;
  }
  err->warnings++;
  cinfo->err->num_warnings++;
}

void OnOutput(j_common_ptr) {}  // never print to stderr from a library

JpegColor ColorOf(J_COLOR_SPACE space) {
  switch (space) {
    case JCS_GRAYSCALE:
      return JpegColor::kGray;
    case JCS_YCbCr:
      return JpegColor::kYCbCr;
    case JCS_RGB:
      return JpegColor::kRGB;
    case JCS_CMYK:
      return JpegColor::kCMYK;
    case JCS_YCCK:
      return JpegColor::kYCCK;
    default:
      return JpegColor::kUnknown;
  }
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool opened = false;  // a header has been read and the decompressor is mid-image
};

JpegDecoder::JpegDecoder() : state_(std::make_unique<State>()) {
  State& s = *state_;
  std::memset(&s.cinfo, 0, sizeof(s.cinfo));
  s.cinfo.err = jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = OnFatal;
  s.err.pub.emit_message = OnMessage;
  s.err.pub.output_message = OnOutput;
  if (setjmp(s.err.jump)) Fail("libjpeg: cannot create a decompressor: ", s.err.message);
  jpeg_create_decompress(&s.cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&state_->cinfo); }

int JpegDecoder::warnings() const { return state_->err.warnings; }
const std::string& JpegDecoder::message() const { return state_->err.message; }

bool JpegDecoder::Open(const uint8_t* data, size_t size, JpegHeader* header) {
  State& s = *state_;
  j_decompress_ptr cinfo = &s.cinfo;
  if (s.opened) jpeg_abort_decompress(cinfo);  // the previous image was left mid-decode
  s.opened = false;
  s.err.warnings = 0;
  s.err.message.clear();
  if (size == 0) {
    s.err.message = "empty input";
    return false;
  }
  if (!LooksLikeJpeg(data, size)) {
    s.err.message = "not a JPEG (no SOI marker)";
    return false;
  }
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(cinfo);
    return false;
  }
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  s.opened = true;
  header->width = static_cast<int>(cinfo->image_width);
  header->height = static_cast<int>(cinfo->image_height);
  header->components = cinfo->num_components;
  header->color = ColorOf(cinfo->jpeg_color_space);
  header->progressive = cinfo->progressive_mode != 0;
  return true;
}

bool JpegDecoder::Decode(int k, const PixelRect& region, ImageU8* out, PixelRect* roi) {
  State& s = *state_;
  j_decompress_ptr cinfo = &s.cinfo;
  CORTADO_CHECK(s.opened, "JpegDecoder::Decode without a successful Open");
  CORTADO_CHECK(k >= 1 && k <= 8, "JPEG DCT scale must be k/8 with k in 1..8, got ", k);
  const int full_w = static_cast<int>(cinfo->image_width);
  const int full_h = static_cast<int>(cinfo->image_height);
  CORTADO_CHECK(region.x >= 0 && region.y >= 0 && region.width > 0 && region.height > 0 &&
                    region.x + region.width <= full_w && region.y + region.height <= full_h,
                "JPEG region ", region.x, ",", region.y, " ", region.width, "x", region.height,
                " is outside the ", full_w, "x", full_h, " image");
  const J_COLOR_SPACE in_space = cinfo->jpeg_color_space;
  if (in_space == JCS_CMYK || in_space == JCS_YCCK || in_space == JCS_UNKNOWN) {
    s.err.message = StrCat("JPEG colour space ", JpegColorName(ColorOf(in_space)),
                           " needs conversion (decode it with OpenCV)");
    return false;
  }
  const int channels = in_space == JCS_GRAYSCALE ? 1 : 3;
  cinfo->out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_EXT_RGB;
  cinfo->scale_num = static_cast<unsigned>(k);
  cinfo->scale_denom = 8;
  cinfo->dct_method = JDCT_ISLOW;  // PIL's and OpenCV's default; SIMD on x86 and ARM
  cinfo->do_fancy_upsampling = TRUE;

  // The region in scaled pixels, rounded outward.
  const int scaled_w = ScaledDim(full_w, k);
  const int scaled_h = ScaledDim(full_h, k);
  const int x0 = static_cast<int>(int64_t{region.x} * k / 8);
  const int y0 = static_cast<int>(int64_t{region.y} * k / 8);
  const int x1 = std::min(scaled_w, ScaledDim(region.x + region.width, k));
  const int y1 = std::min(scaled_h, ScaledDim(region.y + region.height, k));

  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(cinfo);
    s.opened = false;
    return false;
  }
  jpeg_start_decompress(cinfo);
  CORTADO_ASSERT(static_cast<int>(cinfo->output_width) == scaled_w &&
                 static_cast<int>(cinfo->output_height) == scaled_h);
  JDIMENSION crop_x = static_cast<JDIMENSION>(x0);
  JDIMENSION crop_w = static_cast<JDIMENSION>(x1 - x0);
  if (crop_w < cinfo->output_width) {
    jpeg_crop_scanline(cinfo, &crop_x, &crop_w);  // widens to the iMCU grid
  } else {
    crop_x = 0;
  }
  const int strip_w = static_cast<int>(cinfo->output_width);  // == crop_w after cropping
  out->Reshape(strip_w, y1 - y0, channels);
  if (y0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
  JSAMPROW rows[16];
  const size_t stride = out->stride();
  while (static_cast<int>(cinfo->output_scanline) < y1) {
    const int at = static_cast<int>(cinfo->output_scanline) - y0;
    const int n = std::min<int>(16, y1 - static_cast<int>(cinfo->output_scanline));
    for (int i = 0; i < n; ++i) rows[i] = out->pixels.data() + (at + i) * stride;
    jpeg_read_scanlines(cinfo, rows, static_cast<JDIMENSION>(n));
  }
  // The rows below the region are never decoded.
  jpeg_abort_decompress(cinfo);
  s.opened = false;
  roi->x = x0 - static_cast<int>(crop_x);
  roi->y = 0;
  roi->width = x1 - x0;
  roi->height = y1 - y0;
  return true;
}

bool JpegDecoder::DecodeFull(const uint8_t* data, size_t size, ImageU8* out) {
  JpegHeader header;
  if (!Open(data, size, &header)) return false;
  PixelRect roi;
  if (!Decode(8, PixelRect{0, 0, header.width, header.height}, out, &roi)) return false;
  CORTADO_ASSERT(roi.x == 0 && roi.width == out->width);
  return true;
}

JpegEncoder::JpegEncoder() {
  handle_ = tjInitCompress();
  CORTADO_CHECK(handle_ != nullptr,
                "TurboJPEG: cannot create a compressor: ", tjGetErrorStr2(nullptr));
}

JpegEncoder::~JpegEncoder() { tjDestroy(static_cast<tjhandle>(handle_)); }

void JpegEncoder::Encode(const ImageU8& image, int quality, bool progressive, std::string* out) {
  CORTADO_CHECK(image.channels == 1 || image.channels == 3, "JPEG encode: ", image.channels,
                " channels (want 1 or 3)");
  CORTADO_CHECK(quality >= 1 && quality <= 100, "JPEG quality must be in 1..100, got ", quality);
  CORTADO_CHECK(image.width > 0 && image.height > 0, "JPEG encode: empty image");
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int format = image.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  const int subsamp = image.channels == 1 ? TJSAMP_GRAY : TJSAMP_420;
  const int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  auto* handle = static_cast<tjhandle>(handle_);
  if (tjCompress2(handle, image.pixels.data(), image.width, static_cast<int>(image.stride()),
                  image.height, format, &buffer, &size, subsamp, quality, flags) != 0) {
    std::string why = tjGetErrorStr2(handle);
    tjFree(buffer);
    Fail("TurboJPEG: cannot encode a ", image.width, "x", image.height, " image: ", why);
  }
  out->assign(reinterpret_cast<const char*>(buffer), size);
  tjFree(buffer);
}

}  // namespace cortado
