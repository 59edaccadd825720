// Test helpers for the data pipeline: a temporary folder, synthetic images, and the odd files
// that ImageNet holds (CMYK and YCCK JPEGs, progressive and grey JPEGs, PNGs named .JPEG),
// written by the tests themselves with libjpeg, TurboJPEG and OpenCV.
#pragma once

#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <string>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "data/image.h"
#include "data/jpeg.h"
#include "engine/base/error.h"
#include "tests/support/files.h"

namespace cortado::testing {

// A photo-like test image: smooth colour gradients plus a few edges, different per `seed`, so
// crops, flips and channel order are all visible and JPEG compresses it realistically.
inline ImageU8 MakeImage(int width, int height, int channels, int seed = 0) {
  ImageU8 img;
  img.Reshape(width, height, channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double u = static_cast<double>(x) / width, v = static_cast<double>(y) / height;
      const double wave = 40 * std::sin(6.0 * u + 4.0 * v + seed);
      const bool box = (x / 16 + y / 16 + seed) % 5 == 0;
      // Fine texture (+-12 levels), as photos have: it is what resampling errors show on.
      const uint32_t hash = (static_cast<uint32_t>(x) * 73856093u) ^
                            (static_cast<uint32_t>(y) * 19349663u) ^
                            (static_cast<uint32_t>(seed) * 83492791u);
      const int grain = static_cast<int>(hash % 25) - 12;
      int rgb[3] = {static_cast<int>(200 * u + wave + 20) + grain,
                    static_cast<int>(200 * v - wave + 30) - grain,
                    static_cast<int>(120 + 80 * u * v + (box ? 60 : 0) + 10 * seed) + grain};
      uint8_t* p = img.row(y) + x * channels;
      if (channels == 1) {
        p[0] = static_cast<uint8_t>(std::clamp((rgb[0] + rgb[1] + rgb[2]) / 3, 0, 255));
      } else {
        for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(std::clamp(rgb[c], 0, 255));
      }
    }
  }
  return img;
}

inline std::string EncodeJpeg(const ImageU8& img, int quality = 90, bool progressive = false) {
  JpegEncoder encoder;
  std::string out;
  encoder.Encode(img, quality, progressive, &out);
  return out;
}

// A CMYK JPEG (Adobe convention: inverted values) that should look like `rgb`: with K at 255
// (no black ink) the stored C, M, Y are the R, G, B values. Written with the libjpeg API,
// which can store CMYK without converting it to YCCK.
inline std::string EncodeCmykJpeg(const ImageU8& rgb, int quality = 92) {
  CORTADO_CHECK(rgb.channels == 3, "EncodeCmykJpeg wants RGB");
  std::vector<uint8_t> cmyk(static_cast<size_t>(rgb.width) * rgb.height * 4);
  for (size_t i = 0; i < static_cast<size_t>(rgb.width) * rgb.height; ++i) {
    for (int c = 0; c < 3; ++c) cmyk[i * 4 + c] = rgb.pixels[i * 3 + c];
    cmyk[i * 4 + 3] = 255;
  }
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = rgb.width;
  cinfo.image_height = rgb.height;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_colorspace(&cinfo, JCS_CMYK);  // store CMYK as is (writes an Adobe marker)
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = cmyk.data() + static_cast<size_t>(cinfo.next_scanline) * rgb.width * 4;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buffer), size);
  free(buffer);
  return out;
}

// A YCCK JPEG (what TurboJPEG and Photoshop make of CMYK input), same convention.
inline std::string EncodeYcckJpeg(const ImageU8& rgb, int quality = 92) {
  std::vector<uint8_t> cmyk(static_cast<size_t>(rgb.width) * rgb.height * 4);
  for (size_t i = 0; i < static_cast<size_t>(rgb.width) * rgb.height; ++i) {
    for (int c = 0; c < 3; ++c) cmyk[i * 4 + c] = rgb.pixels[i * 3 + c];
    cmyk[i * 4 + 3] = 255;
  }
  tjhandle h = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, cmyk.data(), rgb.width, 0, rgb.height, TJPF_CMYK, &buffer, &size,
                             TJSAMP_444, quality, 0);
  std::string out = rc == 0 ? std::string(reinterpret_cast<char*>(buffer), size) : "";
  tjFree(buffer);
  tjDestroy(h);
  CORTADO_CHECK(!out.empty(), "TurboJPEG CMYK encode failed");
  return out;
}

inline std::string EncodeWithOpenCV(const ImageU8& img, const std::string& ext) {
  cv::Mat m(img.height, img.width, CV_8UC(img.channels), const_cast<uint8_t*>(img.pixels.data()));
  cv::Mat bgr;
  if (img.channels == 3) {
    cv::cvtColor(m, bgr, cv::COLOR_RGB2BGR);
  } else {
    bgr = m;
  }
  std::vector<uchar> buf;
  CORTADO_CHECK(cv::imencode(ext, bgr, buf), "imencode ", ext, " failed");
  return std::string(buf.begin(), buf.end());
}

// Mean absolute difference of two same-shape images.
inline double MeanAbsDiff(const ImageU8& a, const ImageU8& b) {
  CORTADO_CHECK(a.width == b.width && a.height == b.height && a.channels == b.channels,
                "MeanAbsDiff: shapes differ");
  double sum = 0;
  for (size_t i = 0; i < a.bytes(); ++i) sum += std::abs(int{a.pixels[i]} - int{b.pixels[i]});
  return sum / static_cast<double>(a.bytes());
}

}  // namespace cortado::testing
