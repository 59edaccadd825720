#include "engine/base/cpu_isa.h"

#include <cpuid.h>

#include <fstream>
#include <mutex>

#ifdef CORTADO_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "cortado/dist/codec.h"
#include "engine/base/env.h"
#include "engine/base/error.h"

namespace cortado {
namespace {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, avx512 = false, avx512_bf16 = false, amx = false;
};

// What the CPU reports and the OS enables: the compiler runtime's checks include the OS saving
// the wide registers (XCR0); AVX512_BF16 (leaf 7.1 EAX bit 5) and AMX-BF16 (leaf 7.0 EDX bit
// 22) are asked of CPUID, as GCC 12's builtin knows neither; AMX counts only with AVX-512.
CpuFeatures DetectCpu() {
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (f.avx512 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    f.avx512_bf16 = (eax & (1u << 5)) != 0;
  }
  if (f.avx512 && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.amx = (edx & (1u << 22)) != 0;
  }
  return f;
}

const CpuFeatures& Cpu() {
  static const CpuFeatures features = DetectCpu();
  return features;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

#ifdef CORTADO_HAVE_ONEDNN
const char* OneDnnIsaName(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}
#endif

}  // namespace

std::string CpuIsaCap() { return EnvChoice("CORTADO_CPU_ISA", "auto", {"auto", "avx2", "avx512"}); }

void ApplyCpuIsaCap() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string cap = CpuIsaCap();
    if (cap == "auto") return;
    const CpuFeatures& f = Cpu();
    const char* missing = !f.avx2 ? "AVX2" : !f.fma ? "FMA" : !f.f16c ? "F16C" : nullptr;
    if (missing == nullptr && cap == "avx512" && !f.avx512) missing = "AVX-512 (F, BW, DQ, VL)";
    CORTADO_CHECK(missing == nullptr, "CORTADO_CPU_ISA=", cap, ", but this CPU (", CpuModel(),
                  ") has no ", missing, "; use auto or a lower set");
#ifdef CORTADO_HAVE_ONEDNN
    // Must precede oneDNN's first primitive; the engine calls this before each path into it.
    const dnnl_status_t status =
        dnnl_set_max_cpu_isa(cap == "avx2" ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_avx512_core);
    CORTADO_CHECK(status == dnnl_success, "CORTADO_CPU_ISA=", cap,
                  ": oneDNN refused the cap (status ", static_cast<int>(status),
                  "; ONEDNN_MAX_CPU_ISA set as well, or oneDNN used before the engine?)");
#endif
  });
}

std::string CpuDescription() {
  ApplyCpuIsaCap();
  const CpuFeatures& f = Cpu();
  std::string extensions;
  auto add = [&](bool has, const char* name) {
    if (has) extensions += (extensions.empty() ? "" : " ") + std::string(name);
  };
  add(f.avx2, "AVX2");
  add(f.fma, "FMA");
  add(f.f16c, "F16C");
  add(f.avx512, "AVX-512");
  add(f.avx512_bf16, "AVX512_BF16");
  add(f.amx, "AMX");
  if (extensions.empty()) extensions = "no AVX2";
  std::string kernels;
#ifdef CORTADO_HAVE_ONEDNN
  kernels = StrCat("oneDNN ", OneDnnIsaName(dnnl_get_effective_cpu_isa()), ", ");
#endif
  const std::string cap = CpuIsaCap();
  return StrCat(CpuModel(), " (", extensions, "; kernels: ", kernels, "codecs ", dist::CodecIsa(),
                cap == "auto" ? "" : StrCat(", capped by CORTADO_CPU_ISA=", cap), ")");
}

}  // namespace cortado
