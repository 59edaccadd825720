#include "engine/graph/gemm_lowp.h"

#include <atomic>
#include <cstring>
#include <type_traits>
#include <unordered_map>
#include <vector>

#ifdef CORTADO_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "cortado/dist/codec.h"
#include "engine/base/cpu_isa.h"
#include "engine/base/env.h"
#include "engine/base/error.h"
#include "engine/graph/math.h"
#include "engine/graph/onednn_runtime.h"

namespace cortado {
namespace {

#ifdef CORTADO_HAVE_ONEDNN
bool CpuHasNativeBF16() {
  ApplyCpuIsaCap();  // CORTADO_CPU_ISA=avx2 or avx512 leaves no native bf16
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16) == bf16;
}
#else
bool CpuHasNativeBF16() { return false; }
#endif

LowpGemmPath DetectPath() {
  const std::string want = EnvChoice("CORTADO_GEMM_BF16", "auto", {"auto", "native", "widened"});
  if (want == "widened") return LowpGemmPath::kWidened;
  if (want == "native" && !CpuHasNativeBF16()) {
    Fail("CORTADO_GEMM_BF16=native, but this ",
#ifdef CORTADO_HAVE_ONEDNN
         "CPU has no AVX512_BF16",
#else
         "build has no oneDNN",
#endif
         "; unset it or use widened");
  }
  return CpuHasNativeBF16() ? LowpGemmPath::kNative : LowpGemmPath::kWidened;
}

std::atomic<int>& PathSlot() {
  static std::atomic<int> path{static_cast<int>(DetectPath())};
  return path;
}

// Widens the stored rows x cols matrix (leading dimension ld) into a dense f32 buffer.
template <typename S>
const float* Widen(const S* src, int64_t rows, int64_t cols, int64_t ld,
                   std::vector<float>& buffer) {
  const dist::CodecKind kind =
      std::is_same_v<S, BFloat16> ? dist::CodecKind::kBF16 : dist::CodecKind::kF16;
  buffer.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    dist::Decode(kind, src + r * ld, static_cast<size_t>(cols), buffer.data() + r * cols);
  }
  return buffer.data();
}

template <typename S>
void WidenedGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* a, int64_t lda,
                 const S* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  static thread_local std::vector<float> wide_a, wide_b;
  const int64_t a_cols = ta ? m : k, b_cols = tb ? k : n;
  const float* fa = Widen(a, ta ? k : m, a_cols, lda, wide_a);
  const float* fb = Widen(b, tb ? n : k, b_cols, ldb, wide_b);
  GemmLd<float>(ta, tb, m, n, k, 1.0f, fa, a_cols, fb, b_cols, beta, c, ldc);
}

#ifdef CORTADO_HAVE_ONEDNN
// One oneDNN matmul per shape, built on first use by each thread (building one costs tens of
// microseconds; a training step runs the same few hundred shapes every iteration).
struct MatmulKey {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t beta_bits;
  bool operator==(const MatmulKey&) const = default;
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const {
    size_t h = static_cast<size_t>(key.ta) * 2 + static_cast<size_t>(key.tb);
    for (int64_t v :
         {key.m, key.n, key.k, key.lda, key.ldb, key.ldc, static_cast<int64_t>(key.beta_bits)}) {
      h = h * 1000003u ^ static_cast<size_t>(v);
    }
    return h;
  }
};
struct Matmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratchpad;
};

Matmul BuildMatmul(const MatmulKey& key) {
  using dnnl::memory;
  // Logical A is M x K, B is K x N; a transposed operand is the same matrix read with swapped
  // strides, so no copy is made.
  const memory::dims a_strides = key.ta ? memory::dims{1, key.lda} : memory::dims{key.lda, 1};
  const memory::dims b_strides = key.tb ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1};
  Matmul mm;
  mm.a = memory::desc({key.m, key.k}, memory::data_type::bf16, a_strides);
  mm.b = memory::desc({key.k, key.n}, memory::data_type::bf16, b_strides);
  mm.c = memory::desc({key.m, key.n}, memory::data_type::f32, memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // onednn::ThreadScratchpad says why
  float beta;
  std::memcpy(&beta, &key.beta_bits, sizeof(beta));
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);  // C = A * B + beta * C
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr,
                                        onednn::Engine());
  mm.primitive = dnnl::matmul(pd);
  mm.scratchpad = pd.scratchpad_desc();
  return mm;
}

void NativeGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
                const BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Each pool thread runs its own products (see GemmLd<float>): onednn_runtime.h.
  static thread_local std::unordered_map<MatmulKey, Matmul, MatmulKeyHash> cache;
  uint32_t beta_bits;
  std::memcpy(&beta_bits, &beta, sizeof(beta));
  const MatmulKey key{ta, tb, m, n, k, lda, ldb, ldc, beta_bits};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 4096) cache.clear();  // a net that reshapes every step: stay bounded
    try {
      it = cache.emplace(key, BuildMatmul(key)).first;
    } catch (const dnnl::error& e) {
      Fail("bf16 matrix product ", m, "x", n, "x", k, ": oneDNN could not build it (", e.what(),
           "); set CORTADO_GEMM_BF16=widened to use the f32 path");
    }
  }
  const Matmul& mm = it->second;
  dnnl::memory am(mm.a, onednn::Engine(), const_cast<BFloat16*>(a));
  dnnl::memory bm(mm.b, onednn::Engine(), const_cast<BFloat16*>(b));
  dnnl::memory cm(mm.c, onednn::Engine(), c);
  mm.primitive.execute(onednn::ThreadStream(),
                       {{DNNL_ARG_SRC, am},
                        {DNNL_ARG_WEIGHTS, bm},
                        {DNNL_ARG_DST, cm},
                        {DNNL_ARG_SCRATCHPAD, onednn::ThreadScratchpad(mm.scratchpad)}});
}
#endif

}  // namespace

LowpGemmPath BF16GemmPath() { return static_cast<LowpGemmPath>(PathSlot().load()); }

const char* LowpGemmPathName(LowpGemmPath path) {
  return path == LowpGemmPath::kNative ? "native" : "widened";
}

bool NativeBF16GemmAvailable() { return CpuHasNativeBF16(); }

void SetBF16GemmPath(LowpGemmPath path) {
  CORTADO_CHECK(path != LowpGemmPath::kNative || CpuHasNativeBF16(),
                "native bf16 products are not available on this CPU or build");
  PathSlot().store(static_cast<int>(path));
}

template <typename S>
void GemmLdLowp(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* a, int64_t lda,
                const S* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // No products: C = beta * C (oneDNN rejects empty reductions).
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
#ifdef CORTADO_HAVE_ONEDNN
  if constexpr (std::is_same_v<S, BFloat16>) {
    if (BF16GemmPath() == LowpGemmPath::kNative) {
      return NativeGemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    }
  }
#endif
  WidenedGemm<S>(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

template <typename S>
void ParallelGemmLowp(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* a, const S* b,
                      float beta, float* c) {
  const int64_t lda = ta ? m : k;
  const int64_t ldb = tb ? k : n;
  SplitGemm(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const S* a_rows = ta ? a + r0 : a + r0 * lda;
    const S* b_cols = tb ? b + c0 * ldb : b + c0;
    GemmLdLowp<S>(ta, tb, r1 - r0, c1 - c0, k, a_rows, lda, b_cols, ldb, beta, c + r0 * n + c0, n);
  });
}

template void GemmLdLowp<BFloat16>(bool, bool, int64_t, int64_t, int64_t, const BFloat16*, int64_t,
                                   const BFloat16*, int64_t, float, float*, int64_t);
template void GemmLdLowp<Half>(bool, bool, int64_t, int64_t, int64_t, const Half*, int64_t,
                               const Half*, int64_t, float, float*, int64_t);
template void ParallelGemmLowp<BFloat16>(bool, bool, int64_t, int64_t, int64_t, const BFloat16*,
                                         const BFloat16*, float, float*);
template void ParallelGemmLowp<Half>(bool, bool, int64_t, int64_t, int64_t, const Half*,
                                     const Half*, float, float*);

}  // namespace cortado
