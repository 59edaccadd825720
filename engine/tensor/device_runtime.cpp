#include "engine/tensor/device_runtime.h"

#include <charconv>

#include "engine/base/error.h"

namespace cortado {

#ifdef CORTADO_HAVE_CUDA
// Defined in engine/cuda/cuda_runtime.cpp: called here by name so the linker keeps it.
DeviceRuntime& CudaRuntime();
#endif

void DeviceRuntime::Reorder(Tensor& dst, const Tensor& src) {
  Fail("reorder of ", src.ToString(), " to ", MemoryFormatName(dst.format()), " on ",
       dst.device().ToString(),
       ": this device's backend has no memory-format reorder yet; run the net with "
       "model.layout: nchw");
}

DeviceRuntime* FindDeviceRuntime(DeviceType type) {
#ifdef CORTADO_HAVE_CUDA
  if (type == DeviceType::kCUDA) return &CudaRuntime();
#endif
  return nullptr;
}

bool DeviceUsable(Device device, std::string* why) {
  if (device.type == DeviceType::kCPU) return true;
  DeviceRuntime* runtime = FindDeviceRuntime(device.type);
  if (runtime == nullptr) {
    *why =
        "this build of Cortado has no CUDA backend (configure with -DCORTADO_CUDA=ON on a "
        "machine with the CUDA toolkit and cuDNN)";
    return false;
  }
  const int count = runtime->DeviceCount(why);
  if (count == 0) return false;
  if (device.index < 0 || device.index >= count) {
    *why = StrCat(device.ToString(), " does not exist: this machine has ", count,
                  " CUDA device(s), cuda:0 to cuda:", count - 1);
    return false;
  }
  return true;
}

DeviceRuntime& RuntimeFor(Device device) {
  std::string why;
  CORTADO_CHECK(device.type != DeviceType::kCPU, "internal: no device runtime for the CPU");
  if (!DeviceUsable(device, &why)) Fail("cannot use ", device.ToString(), ": ", why);
  return *FindDeviceRuntime(device.type);
}

Device ParseDevice(const std::string& text) {
  if (text == "cpu") return Device::CPU();
  if (text == "cuda") return Device{DeviceType::kCUDA, 0};
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    int index = -1;
    const char* begin = text.data() + 5;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(begin, end, index);
    if (ec == std::errc() && ptr == end && index >= 0) return Device{DeviceType::kCUDA, index};
  }
  Fail("device '", text, "' is not one of: cpu, cuda, cuda:N (N = 0, 1, ...)");
}

}  // namespace cortado
