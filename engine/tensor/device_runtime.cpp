#include "engine/tensor/device_runtime.h"

#include <charconv>

#include "engine/base/error.h"
#include "engine/tensor/test_device.h"

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

std::unique_ptr<StreamEvent> DeviceRuntime::CopyToHostAsync(Tensor& dst, const Tensor& src) {
  // Done by the time it returns: the copy into host memory waits for itself.
  class Done final : public StreamEvent {
   public:
    bool Reached() override { return true; }
    void Wait() override {}
  };
  Copy(dst, src);
  return std::make_unique<Done>();
}

DeviceRuntime* FindDeviceRuntime(DeviceType type) {
  if (type == DeviceType::kTest) return &TestDeviceRuntime();
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
    const char* kind = device.type == DeviceType::kTest ? "test" : "cuda";
    *why = StrCat(device.ToString(), " does not exist: there are ", count, " ", kind,
                  " device(s), ", kind, ":0 to ", kind, ":", count - 1);
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

const std::shared_ptr<Allocator>& AllocatorFor(Device device) {
  if (device.type == DeviceType::kCPU) return CpuAllocator();
  return RuntimeFor(device).DeviceAllocator(device.index);
}

void AssignConverted(Tensor& dst, const Tensor& src) {
  if (src.device() == dst.device()) return dst.ConvertFrom(src);
  if (src.dtype() == dst.dtype()) return dst.CopyFrom(src.To(dst.device()));
  Tensor host(src.shape(), dst.dtype());
  host.set_format(src.format());
  host.ConvertFrom(src.To(Device::CPU()));
  dst.CopyFrom(host.To(dst.device()));
}

Device ParseDevice(const std::string& text) {
  if (text == "cpu") return Device::CPU();
  for (const auto& [name, type] : {std::pair<std::string, DeviceType>{"cuda", DeviceType::kCUDA},
                                   std::pair<std::string, DeviceType>{"test", DeviceType::kTest}}) {
    if (text == name) return Device{type, 0};
    if (text.rfind(name + ":", 0) == 0 && text.size() > name.size() + 1) {
      int index = -1;
      const char* begin = text.data() + name.size() + 1;
      const char* end = text.data() + text.size();
      auto [ptr, ec] = std::from_chars(begin, end, index);
      if (ec == std::errc() && ptr == end && index >= 0) return Device{type, index};
    }
  }
  Fail("device '", text,
       "' is not one of: cpu, cuda, cuda:N, test, test:N (N = 0, 1, ...; test is the guarded "
       "host-memory test device)");
}

}  // namespace cortado
