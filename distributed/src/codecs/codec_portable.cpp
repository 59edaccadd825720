// The portable kernel set of the gradient codecs: plain C++, for every CPU, and the rest of the
// vector sets' streams. It works on blocks of kBlock values in stack buffers: codes are computed
// by branch-free per-value functions (so loops over them vectorize where the compiler may), then
// packed; written independently of the scalar reference (codec.cpp) and tested against it. The
// per-value functions are codec_values.h's, which the CUDA kernels share.
#include <algorithm>
#include <bit>
#include <cstring>

#include "codecs/codec_dispatch.h"
#include "codecs/codec_internal.h"
#include "cortado/dist/types.h"

namespace cortado::dist::codec_internal {
namespace {

constexpr size_t kBlock = 512;  // values per pass (a multiple of 8: blocks start at groups)
static_assert(kBlock % 8 == 0);

void RandomWords(uint64_t seed, uint64_t first, size_t n, uint32_t* r) {
  const uint32_t lo = static_cast<uint32_t>(first);
  if (lo + static_cast<uint64_t>(n) <= (uint64_t{1} << 32)) {
    // The upper index word is the same for all n: hoist it.
    const uint32_t key = HashKey(seed, first), seed_lo = static_cast<uint32_t>(seed);
    for (size_t i = 0; i < n; ++i) {
      r[i] = Fmix32(((lo + static_cast<uint32_t>(i)) * kHashLo + seed_lo) ^ key);
    }
  } else {
    for (size_t i = 0; i < n; ++i) r[i] = StochasticBits(seed, first + i);
  }
}

// Whole groups in two passes: a plain loop (which vectorizes) splits the codes into a byte of
// high part and a byte of low part each; then per group the 8 high bytes are copied and the
// planes gathered by 64-bit multiplies: with the 8 low parts one per byte of w, bit p of every
// byte lands in one byte by (w >> p & 0x0101..01) * 0x0102040810204080 >> 56 (byte j's bit on
// bit 56 + j, no two partial products meeting). Back, a plane byte spread over 8 bytes keeps bit
// j in byte j by a mask, which adding 0x7f per byte moves to the byte's top bit.
constexpr uint64_t kByteLsbs = 0x0101010101010101ull;
constexpr uint64_t kGather = 0x0102040810204080ull;
constexpr uint64_t kBitOfByte = 0x8040201008040201ull;

// 8 bytes as a little-endian word and back (the bytes of value j are byte j).
inline uint64_t LoadLittleEndian64(const uint8_t* src) {
  uint64_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, src, 8);
  } else {
    for (int b = 0; b < 8; ++b) v |= uint64_t{src[b]} << 8 * b;
  }
  return v;
}
inline void StoreLittleEndian64(uint8_t* dst, uint64_t v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(dst, &v, 8);
  } else {
    for (int b = 0; b < 8; ++b) dst[b] = static_cast<uint8_t>(v >> 8 * b);
  }
}

template <CodecKind K>
void PackGroups(const uint32_t* codes, size_t n, uint8_t* dst) {
  using S = Split<K>;
  uint8_t high[kBlock], low[kBlock];
  for (size_t i = 0; i < n; ++i) {
    high[i] = static_cast<uint8_t>(S::High(codes[i]));
    low[i] = static_cast<uint8_t>(S::Low(codes[i]));
  }
  size_t g = 0;
  for (; g + 8 <= n; g += 8, dst += 8 + S::kLow) {
    std::memcpy(dst, high + g, 8);
    const uint64_t w = LoadLittleEndian64(low + g);
    for (int p = 0; p < S::kLow; ++p) {
      dst[8 + p] = static_cast<uint8_t>(((w >> p) & kByteLsbs) * kGather >> 56);
    }
  }
  if (g < n) PackGroup<K>(codes + g, static_cast<int>(n - g), dst);  // the last, partial one
}

template <CodecKind K>
void UnpackGroups(const uint8_t* src, size_t n, uint32_t* codes) {
  using S = Split<K>;
  uint8_t high[kBlock], low[kBlock];
  size_t g = 0;
  for (; g + 8 <= n; g += 8, src += 8 + S::kLow) {
    std::memcpy(high + g, src, 8);
    uint64_t w = 0;
    for (int p = 0; p < S::kLow; ++p) {
      const uint64_t bits = (src[8 + p] * kByteLsbs) & kBitOfByte;  // byte j: bit j or 0
      w |= ((bits + 0x7f7f7f7f7f7f7f7full) & 0x8080808080808080ull) >> (7 - p);
    }
    StoreLittleEndian64(low + g, w);
  }
  for (size_t i = 0; i < g; ++i) codes[i] = S::Join(high[i], low[i]);
  if (g < n) UnpackGroup<K>(src, static_cast<int>(n - g), codes + g);  // the last, partial one
}

// Whether K's codes are bit-packed in groups of 8 (PackGroups, UnpackGroups). The word and byte
// formats have no groups: PackGroup and UnpackGroup take a whole pass of them (n <= kBlock).
constexpr bool InGroups(CodecKind k) { return k == CodecKind::kEpgc11 || k == CodecKind::kEpgc9; }

}  // namespace

// Loops<Isa::kPortable> (codec_dispatch.h): every value, kBlock at a time.
template <>
template <CodecKind K, Rounding R, bool kResidual>
size_t Loops<Isa::kPortable>::Encode(const float* src, size_t count, uint8_t* dst,
                                     const EncodeOptions& options, float* residual) {
  uint32_t in[kBlock], codes[kBlock], rnd[kBlock];
  const auto* bytes = reinterpret_cast<const uint8_t*>(src);  // src may be unaligned
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    std::memcpy(in, bytes + done * 4, n * 4);
    if constexpr (R == Rounding::kStochastic) {
      RandomWords(options.seed, options.first_index + done, n, rnd);
      for (size_t i = 0; i < n; ++i) codes[i] = EncodeBits<K, R>(in[i], rnd[i]);
    } else {
      for (size_t i = 0; i < n; ++i) codes[i] = EncodeBits<K, R>(in[i], 0);
    }
    if constexpr (kResidual) {
      float* res = residual + done;
      for (size_t i = 0; i < n; ++i) {
        res[i] = res[i] + Loss(BitsToFloat(in[i]), BitsToFloat(DecodeBits<K>(codes[i])));
      }
    }
    uint8_t* out = dst + EncodedBytes(K, done);
    if constexpr (InGroups(K)) {
      PackGroups<K>(codes, n, out);
    } else {
      PackGroup<K>(codes, static_cast<int>(n), out);
    }
  }
  return count;
}

template <>
template <CodecKind K, bool kAccumulate>
size_t Loops<Isa::kPortable>::Decode(const uint8_t* src, size_t count, float* dst) {
  uint32_t codes[kBlock];
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    float* out = dst + done;
    if constexpr (K == CodecKind::kF32) {
      const uint8_t* in = src + done * 4;  // any alignment: read each float by memcpy
      for (size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        out[i] = kAccumulate ? out[i] + v : v;  // (DecodeSet copies for a plain decode)
      }
    } else {
      const uint8_t* in = src + EncodedBytes(K, done);
      if constexpr (InGroups(K)) {
        UnpackGroups<K>(in, n, codes);
      } else {
        UnpackGroup<K>(in, static_cast<int>(n), codes);
      }
      for (size_t i = 0; i < n; ++i) {
        const float d = BitsToFloat(DecodeBits<K>(codes[i]));
        out[i] = kAccumulate ? out[i] + d : d;
      }
    }
  }
  return count;
}

template void EncodeSet<Isa::kPortable>(CodecKind, const float*, size_t, uint8_t*,
                                        const EncodeOptions&, float*);
template void DecodeSet<Isa::kPortable>(CodecKind, const uint8_t*, size_t, float*, bool);

}  // namespace cortado::dist::codec_internal
