#include "engine/tensor/indexed_launch.h"

namespace cortado {

Device DeviceOfLaunch(const char* what, const std::vector<Tensor>& tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.empty()) continue;
    if (first == nullptr) {
      first = &t;
    } else if (t.device() != first->device()) {
      Fail(what, ": ", t.name().empty() ? "" : StrCat("'", t.name(), "' "), t.ToString(), " is on ",
           t.device().ToString(), ", not on ", first->device().ToString(), " with ",
           first->name().empty() ? "" : StrCat("'", first->name(), "' "), first->ToString(),
           " (a kernel runs on one device)");
    }
  }
  return first == nullptr ? Device::CPU() : first->device();
}

}  // namespace cortado
