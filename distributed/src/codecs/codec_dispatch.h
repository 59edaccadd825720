// Internal: how a call reaches a kernel set's loops, written once for the three sets. The codec
// kind, rounding mode and the residual / accumulate flags are runtime values, the loops templates
// on them: VisitEnum is the one place that turns the first into the second. EncodeSet<I> and
// DecodeSet<I> run set I's loops over the whole blocks from the start of the stream and hand the
// rest to the set below it (AVX-512 -> AVX2 -> portable), which is how a vector set handles any
// count. Included by the kernel sets' files only: each defines its Loops<I> and instantiates
// EncodeSet<I> and DecodeSet<I> (codec.cpp calls them through codec_internal.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "codecs/codec_internal.h"
#include "cortado/dist/error.h"

namespace cortado::dist::codec_internal {

// f(std::integral_constant<E, value>{}) for the one of kValues that equals `value`: a runtime
// value as a template argument. Throws kInvalidArgument naming `what` for any other value.
template <auto kFirst, auto... kRest, class E, class F>
decltype(auto) VisitEnum(E value, const char* what, F&& f) {
  if (value == kFirst) return f(std::integral_constant<E, kFirst>{});
  if constexpr (sizeof...(kRest) > 0) {
    return VisitEnum<kRest...>(value, what, f);
  } else {
    Fail(ErrorKind::kInvalidArgument, "unknown ", what, " ", static_cast<unsigned>(value));
  }
}

template <class F>
decltype(auto) VisitCodecKind(CodecKind kind, F&& f) {
  return VisitEnum<CodecKind::kF32, CodecKind::kF16, CodecKind::kBF16, CodecKind::kEpgc11,
                   CodecKind::kEpgc9, CodecKind::kEpgc8>(kind, "codec kind", f);
}
template <class F>
decltype(auto) VisitRounding(Rounding rounding, F&& f) {
  return VisitEnum<Rounding::kNearest, Rounding::kTruncate, Rounding::kStochastic>(
      rounding, "rounding mode", f);
}
template <class F>
decltype(auto) VisitFlag(bool flag, F&& f) {
  return VisitEnum<true, false>(flag, "flag", f);
}

// The loops of kernel set I: each set's file defines them (template <> template <...>
// Loops<Isa::kX>::Encode ...). They do whole blocks from the start of their stream and return
// how many values that was, a multiple of 8 (so the rest starts on a group of the packed
// formats); the portable set does all of them. Encode is never asked for f32, Decode for f32
// only to accumulate: the other cases are copies.
template <Isa I>
struct Loops {
  template <CodecKind K, Rounding R, bool kResidual>
  static size_t Encode(const float* src, size_t count, uint8_t* dst, const EncodeOptions& options,
                       float* residual);
  template <CodecKind K, bool kAccumulate>
  static size_t Decode(const uint8_t* src, size_t count, float* dst);
};

// The set below I, which does what I's loops leave.
constexpr Isa NextSet(Isa isa) { return isa == Isa::kAvx512 ? Isa::kAvx2 : Isa::kPortable; }

template <Isa I>
void EncodeSet(CodecKind kind, const float* src, size_t count, uint8_t* dst,
               const EncodeOptions& options, float* residual) {
  const size_t done = VisitCodecKind(kind, [&](auto k) -> size_t {
    if constexpr (k() == CodecKind::kF32) {
      std::memcpy(dst, src, count * 4);  // lossless: the residual gains nothing
      return count;
    } else {
      return VisitRounding(options.rounding, [&](auto r) {
        return VisitFlag(residual != nullptr, [&](auto with_residual) {
          return Loops<I>::template Encode<k(), r(), with_residual()>(src, count, dst, options,
                                                                      residual);
        });
      });
    }
  });
  if constexpr (I != Isa::kPortable) {
    if (done < count) {
      EncodeOptions rest = options;  // the same stream, from value `done` on
      rest.first_index += done;
      EncodeSet<NextSet(I)>(kind, src + done, count - done, dst + EncodedBytes(kind, done), rest,
                            residual != nullptr ? residual + done : nullptr);
    }
  }
}

template <Isa I>
void DecodeSet(CodecKind kind, const uint8_t* src, size_t count, float* dst, bool accumulate) {
  const size_t done = VisitCodecKind(kind, [&](auto k) -> size_t {
    if constexpr (k() == CodecKind::kF32) {
      if (!accumulate) {
        std::memcpy(dst, src, count * 4);
        return count;
      }
      return Loops<I>::template Decode<k(), true>(src, count, dst);
    } else {
      return VisitFlag(accumulate, [&](auto accumulate_tag) {
        return Loops<I>::template Decode<k(), accumulate_tag()>(src, count, dst);
      });
    }
  });
  if constexpr (I != Isa::kPortable) {
    if (done < count) {
      DecodeSet<NextSet(I)>(kind, src + EncodedBytes(kind, done), count - done, dst + done,
                            accumulate);
    }
  }
}

// Each set's file instantiates its own (where its Loops are complete).
extern template void EncodeSet<Isa::kPortable>(CodecKind, const float*, size_t, uint8_t*,
                                               const EncodeOptions&, float*);
extern template void DecodeSet<Isa::kPortable>(CodecKind, const uint8_t*, size_t, float*, bool);
#if CORTADO_CODEC_HAVE_AVX2
extern template void EncodeSet<Isa::kAvx2>(CodecKind, const float*, size_t, uint8_t*,
                                           const EncodeOptions&, float*);
extern template void DecodeSet<Isa::kAvx2>(CodecKind, const uint8_t*, size_t, float*, bool);
#endif

}  // namespace cortado::dist::codec_internal
