#include "engine/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "cortado/dist/types.h"
#include "engine/tensor/dtype.h"

namespace cortado {
namespace {

TEST(Tensor, ShapeDtypeAndAlignment) {
  Tensor t({2, 3, 4}, DType::kF32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_EQ(t.ToString(), "f32[2, 3, 4]");
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.dim(3), Error);
}

TEST(Tensor, CopiesShareStorageCloneDoesNot) {
  Tensor a({4}, DType::kF32);
  a.Fill(1.0);
  Tensor b = a;
  Tensor c = a.Clone();
  b.data<float>()[0] = 5;
  EXPECT_EQ(a.data<float>()[0], 5);
  EXPECT_EQ(c.data<float>()[0], 1);
}

TEST(Tensor, ResizeKeepsStorageWhenItFits) {
  Tensor a({8}, DType::kF32);
  void* p = a.raw_data();
  a.Resize({2, 2});
  EXPECT_EQ(a.raw_data(), p);
  EXPECT_EQ(a.numel(), 4);
  a.Resize({100});
  EXPECT_EQ(a.numel(), 100);
  EXPECT_THROW(a.Resize({-1}), Error);
}

TEST(Tensor, ViewNeedsSameCount) {
  Tensor a({2, 6});
  EXPECT_EQ(a.View({3, 4}).raw_data(), a.raw_data());
  EXPECT_THROW(a.View({5}), Error);
}

TEST(Tensor, OffsetViewsShareTheBlock) {
  Tensor block({10});
  for (int i = 0; i < 10; ++i) block.data<float>()[i] = static_cast<float>(i);
  Tensor v = block.View({2, 2}, 3);  // elements 3..6
  EXPECT_EQ(v.numel(), 4);
  EXPECT_EQ(v.storage_offset(), 3);
  EXPECT_TRUE(v.SharesStorageWith(block));
  EXPECT_EQ(v.data<float>()[0], 3.0f);
  v.data<float>()[3] = -1;
  EXPECT_EQ(block.data<float>()[6], -1.0f);
  // A view of a view adds offsets; a resize that fits keeps the view in place.
  Tensor w = v.View({2}, 2);
  EXPECT_EQ(w.data<float>()[0], 5.0f);
  v.Resize({4});
  EXPECT_TRUE(v.SharesStorageWith(block));
  EXPECT_EQ(v.data<float>()[0], 3.0f);
  v.Zero();
  EXPECT_EQ(block.data<float>()[2], 2.0f);
  EXPECT_EQ(block.data<float>()[3], 0.0f);
  EXPECT_EQ(block.data<float>()[7], 7.0f);
  // Growing past the block detaches the view instead of writing beyond it.
  v.Resize({8});
  EXPECT_FALSE(v.SharesStorageWith(block));
  EXPECT_EQ(v.storage_offset(), 0);
  EXPECT_THROW(block.View({4}, 7), Error);
  EXPECT_THROW(block.View({1}, -1), Error);
  // Clone copies only the view's elements.
  Tensor c = block.View({3}, 1).Clone();
  EXPECT_EQ(c.numel(), 3);
  EXPECT_EQ(c.data<float>()[0], 1.0f);
}

TEST(Tensor, ConvertBetweenFloatTypes) {
  Tensor a({3}, DType::kF64);
  a.data<double>()[0] = 1.5;
  a.data<double>()[1] = -2.25;
  a.data<double>()[2] = 1e-3;
  Tensor h({3}, DType::kF16);
  h.ConvertFrom(a);
  Tensor back({3}, DType::kF32);
  back.ConvertFrom(h);
  EXPECT_EQ(back.data<float>()[0], 1.5f);
  EXPECT_EQ(back.data<float>()[1], -2.25f);
  EXPECT_NEAR(back.data<float>()[2], 1e-3, 1e-6);
}

// The dtype table: every DType's name parses back to it with its size, DTypeOf maps each C++
// element type to the DType of the same position, and an unknown name lists the known ones.
// A channels-last tensor holds element (n, c, h, w) at ((n H + h) W + w) C + c; ReorderFrom
// moves every element to its place both ways, for each element size, on shapes whose sides are
// not multiples of the transpose's tiles.
TEST(Tensor, ReorderMovesEveryElementBetweenFormats) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kU8}) {
    const int64_t n = 2, c = 37, h = 5, w = 9;
    Tensor a({n, c, h, w}, dtype);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double v = static_cast<double>(i % 251);
      if (dtype == DType::kF32) a.data<float>()[i] = static_cast<float>(v);
      if (dtype == DType::kF64) a.data<double>()[i] = v;
      if (dtype == DType::kBF16) a.data<BFloat16>()[i] = FloatToBFloat16(static_cast<float>(v));
      if (dtype == DType::kU8) a.data<uint8_t>()[i] = static_cast<uint8_t>(v);
    }
    const Tensor b = a.Reordered(MemoryFormat::kNHWC);
    EXPECT_TRUE(b.channels_last());
    EXPECT_EQ(b.shape(), a.shape());  // the logical shape stays (N, C, H, W)
    EXPECT_EQ(b.ToString(), StrCat(DTypeName(dtype), "[2, 37, 5, 9] nhwc"));
    for (int64_t in = 0; in < n; ++in)
      for (int64_t ic = 0; ic < c; ++ic)
        for (int64_t ih = 0; ih < h; ++ih)
          for (int64_t iw = 0; iw < w; ++iw) {
            const int64_t nchw = ((in * c + ic) * h + ih) * w + iw;
            const int64_t nhwc = ((in * h + ih) * w + iw) * c + ic;
            ASSERT_EQ(ElementAsDouble(b, nhwc), ElementAsDouble(a, nchw)) << DTypeName(dtype);
          }
    Tensor back({n, c, h, w}, dtype);
    back.ReorderFrom(b);
    EXPECT_EQ(0, std::memcmp(back.raw_data(), a.raw_data(), a.nbytes()));
  }
}

TEST(Tensor, FormatsAreLabelsThatOperationsRespect) {
  Tensor a({2, 3, 4, 5}, DType::kF32);
  a.Fill(1.0);
  a.set_format(MemoryFormat::kNHWC);
  EXPECT_TRUE(a.Clone().channels_last());
  a.Resize({4, 3, 4, 5});  // still 4-d: keeps the format
  EXPECT_TRUE(a.channels_last());
  EXPECT_EQ(a.View(a.shape()).format(), MemoryFormat::kNHWC);
  // Another shape would read NHWC memory as row-major: refused, naming the fix.
  EXPECT_THROW(a.View({4, 60}), Error);
  EXPECT_THROW(a.View({60}, 0), Error);
  // Copies and conversions refuse to mix the formats (ReorderFrom moves elements).
  Tensor nchw({4, 3, 4, 5}, DType::kF32);
  EXPECT_THROW(nchw.CopyFrom(a), Error);
  EXPECT_THROW(nchw.ConvertFrom(a), Error);
  EXPECT_NO_THROW(nchw.ReorderFrom(a));
  // Only 4-d tensors have a format.
  Tensor v({3}, DType::kF32);
  EXPECT_THROW(v.set_format(MemoryFormat::kNHWC), Error);
  a.Resize({10});
  EXPECT_EQ(a.format(), MemoryFormat::kNCHW);
  // A pooled (N, C, 1, 1) or a 1-channel image lies the same in both: viewable, copyable.
  Tensor pooled({2, 8, 1, 1}, DType::kF32);
  pooled.set_format(MemoryFormat::kNHWC);
  EXPECT_TRUE(pooled.IsLayoutTrivial());
  EXPECT_EQ(pooled.View({2, 8}).shape(), (Shape{2, 8}));
  Tensor flat({2, 8, 1, 1}, DType::kF32);
  EXPECT_NO_THROW(flat.CopyFrom(pooled));
}

TEST(DType, NamesSizesAndElementTypes) {
  const std::pair<DType, size_t> sizes[] = {{DType::kF32, 4},  {DType::kF64, 8}, {DType::kF16, 2},
                                            {DType::kBF16, 2}, {DType::kI32, 4}, {DType::kU8, 1}};
  for (const auto& [dtype, size] : sizes) {
    SCOPED_TRACE(DTypeName(dtype));
    EXPECT_EQ(ParseDType(DTypeName(dtype)), dtype);
    EXPECT_EQ(DTypeSize(dtype), size);
  }
  static_assert(DTypeOf<float>::value == DType::kF32 && DTypeOf<double>::value == DType::kF64 &&
                DTypeOf<Half>::value == DType::kF16 && DTypeOf<BFloat16>::value == DType::kBF16 &&
                DTypeOf<int32_t>::value == DType::kI32 && DTypeOf<uint8_t>::value == DType::kU8);
  EXPECT_STREQ(DTypeName(static_cast<DType>(6)), "?");
  try {
    ParseDType("f8");
    ADD_FAILURE() << "ParseDType(\"f8\") did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(
        std::string(e.what()).find("unknown dtype 'f8' (known: f32, f64, f16, bf16, i32, u8)"),
        std::string::npos)
        << e.what();
  }
}

TEST(Half, RoundTripAndSpecialValues) {
  // Every finite half converts to float and back to itself.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Half h{static_cast<uint16_t>(bits)};
    float f = HalfToFloat(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f).bits, h.bits) << "bits " << bits;
  }
  EXPECT_EQ(FloatToHalf(65504.0f).bits, 0x7bffu);
  EXPECT_EQ(FloatToHalf(65520.0f).bits, 0x7c00u);            // rounds to inf
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048).bits, 0x3c00u);  // tie rounds to even
  EXPECT_EQ(FloatToHalf(5.96046448e-8f).bits, 0x0001u);      // smallest subnormal
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_EQ(FloatToBFloat16(dist::BitsToFloat(0x3f808000u)).bits, 0x3f80u);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16(dist::BitsToFloat(0x3f818000u)).bits, 0x3f82u);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

}  // namespace
}  // namespace cortado
