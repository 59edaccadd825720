// ImageU8: an 8-bit image in interleaved (HWC) layout, RGB or grayscale, as the decoders produce
// it and the transforms consume it. The pixel buffer is reused: Reshape only grows it, so a
// decode thread that keeps one ImageU8 allocates nothing after the first few images.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cortado {

struct ImageU8 {
  int width = 0;
  int height = 0;
  int channels = 0;  // 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;

  void Reshape(int w, int h, int c) {
    width = w;
    height = h;
    channels = c;
    size_t need = static_cast<size_t>(w) * h * c;
    if (pixels.size() < need) pixels.resize(need);
  }
  size_t stride() const { return static_cast<size_t>(width) * channels; }
  uint8_t* row(int y) { return pixels.data() + y * stride(); }
  const uint8_t* row(int y) const { return pixels.data() + y * stride(); }
  size_t bytes() const { return static_cast<size_t>(height) * stride(); }
};

}  // namespace cortado
