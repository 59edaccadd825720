// CORTADO_CPU_ISA caps every kernel set chosen at run time. The cap is applied once per
// process (oneDNN takes it only before its first use), so each case runs in a child process
// (a death test that exits 0 when its checks hold, or 1 printing what failed).
#include "engine/base/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cortado/dist/codec.h"
#include "engine/base/error.h"
#include "engine/graph/gemm_lowp.h"
#include "engine/graph/math.h"

namespace cortado {
namespace {

bool CpuHasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

// In a child: sets CORTADO_CPU_ISA=value, runs one f32 product (oneDNN's first use) and then
// `check`; exits 0 when check() returns an empty string, else prints it and exits 1.
template <typename Check>
[[noreturn]] void ChildWithCap(const char* value, Check check) {
  ::setenv("CORTADO_CPU_ISA", value, 1);
  std::string failure;
  try {
    float a[4] = {1, 2, 3, 4}, c[4] = {};
    Gemm<float>(false, false, 2, 2, 2, 1.0f, a, a, 0.0f, c);
    if (c[0] != 7 || c[3] != 22) failure = "the product is wrong under the cap";
    if (failure.empty()) failure = check();
  } catch (const std::exception& e) {
    failure = std::string("threw: ") + e.what();
  }
  if (!failure.empty()) std::fprintf(stderr, "%s\n", failure.c_str());
  std::exit(failure.empty() ? 0 : 1);
}

template <typename Check>
void InChildWithCap(const char* value, Check check) {
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(ChildWithCap(value, check), testing::ExitedWithCode(0), "");
}

// In a child: CORTADO_CPU_ISA=value, then the cap; exits 3 printing the error, 0 without one.
[[noreturn]] void ChildApplyingCap(const char* value) {
  ::setenv("CORTADO_CPU_ISA", value, 1);
  try {
    ApplyCpuIsaCap();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(3);
  }
  std::exit(0);
}

TEST(CpuIsa, Avx2CapsOneDnnTheCodecsAndTheBF16Path) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "this CPU has no AVX2 and FMA";
  }
  InChildWithCap("avx2", [] {
    const std::string d = CpuDescription();
    if (d.find("oneDNN avx2,") == std::string::npos &&
        d.find("oneDNN") != std::string::npos) {  // a build without oneDNN names none
      return "oneDNN is not capped at avx2: " + d;
    }
    if (std::string(dist::CodecIsa()) == "avx512") return "the codecs run AVX-512: " + d;
    if (d.find("capped by CORTADO_CPU_ISA=avx2") == std::string::npos) {
      return "the description does not name the cap: " + d;
    }
    if (NativeBF16GemmAvailable()) return std::string("native bf16 products are still on");
    return std::string();
  });
}

TEST(CpuIsa, Avx512CapLeavesNoNativeBF16) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  InChildWithCap("avx512", [] {
    const std::string d = CpuDescription();
    if (d.find("oneDNN avx512_core,") == std::string::npos &&
        d.find("oneDNN") != std::string::npos) {
      return "oneDNN is not capped at avx512_core: " + d;
    }
    if (NativeBF16GemmAvailable()) return std::string("native bf16 products are still on");
    return std::string();
  });
}

// Above the CPU: one line naming the variable and the missing extension, at first use.
TEST(CpuIsa, ACapAboveTheCpuIsRefusedNamingWhatIsMissing) {
  if (CpuHasAvx512()) GTEST_SKIP() << "this CPU has AVX-512: no cap is above it";
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(ChildApplyingCap("avx512"), testing::ExitedWithCode(3),
              "CORTADO_CPU_ISA=avx512, but this CPU .* has no AVX-512");
}

TEST(CpuIsa, AnUnknownValueIsRefusedListingTheKnownOnes) {
  ::setenv("CORTADO_CPU_ISA", "sse9", 1);
  try {
    CpuIsaCap();
    ADD_FAILURE() << "sse9 was taken";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("CORTADO_CPU_ISA='sse9': must be one of auto, avx2, avx512"),
        std::string::npos)
        << e.what();
  }
  ::unsetenv("CORTADO_CPU_ISA");
  EXPECT_EQ(CpuIsaCap(), "auto");
}

TEST(CpuIsa, TheDescriptionNamesTheCpuAndItsKernels) {
  const std::string d = CpuDescription();
  EXPECT_NE(d.find("kernels: "), std::string::npos) << d;
  EXPECT_NE(d.find(std::string("codecs ") + dist::CodecIsa()), std::string::npos) << d;
  EXPECT_EQ(d.find("unknown CPU"), std::string::npos) << d;
}

}  // namespace
}  // namespace cortado
