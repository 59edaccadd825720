// The device codecs' entry points in a build without CUDA: they say so.
#include "cortado/dist/codec_device.h"
#include "cortado/dist/error.h"

namespace cortado::dist {
namespace {

[[noreturn]] void NotBuilt() {
  Fail(ErrorKind::kConfig,
       "the gradient codecs on a GPU are not in this build of the communication library "
       "(build it where nvcc is found, with CORTADO_DIST_CUDA on)");
}

}  // namespace

bool DeviceCodecsBuilt() { return false; }
void EncodeOnDevice(CodecKind, const float*, size_t, void*, const EncodeOptions&, float*, void*) {
  NotBuilt();
}
void DecodeOnDevice(CodecKind, const void*, size_t, float*, void*) { NotBuilt(); }
void DecodeAccumulateOnDevice(CodecKind, const void*, size_t, float*, void*) { NotBuilt(); }

}  // namespace cortado::dist
