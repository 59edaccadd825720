#include "engine/graph/onednn_runtime.h"

#ifdef CORTADO_HAVE_ONEDNN
#include <omp.h>

#include <cstdint>
#include <vector>

#include "engine/base/cpu_isa.h"

namespace cortado::onednn {
namespace {

void SingleThreaded() {
  static thread_local const bool single = (omp_set_num_threads(1), true);
  (void)single;
}

}  // namespace

dnnl::engine& Engine() {
  SingleThreaded();
  static dnnl::engine engine = (ApplyCpuIsaCap(), dnnl::engine(dnnl::engine::kind::cpu, 0));
  return engine;
}

dnnl::stream& ThreadStream() {
  SingleThreaded();
  static thread_local dnnl::stream stream(Engine());
  return stream;
}

dnnl::memory ThreadScratchpad(const dnnl::memory::desc& desc) {
  static thread_local std::vector<uint64_t> buffer;  // 8-byte aligned; oneDNN asks for no more
  const size_t words = (desc.get_size() + 7) / 8;
  if (buffer.size() < words) buffer.resize(words);
  return dnnl::memory(desc, Engine(), buffer.data());
}

}  // namespace cortado::onednn
#endif
