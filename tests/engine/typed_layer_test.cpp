// TypedLayer sends each dtype named in its KernelTypes to the layer's kernel template and keeps
// Layer's default for the others: f32/f64 fail naming the layer, bf16/f16 compute in f32,
// other dtypes fail unless OtherDTypes is named.
#include "engine/graph/typed_layer.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace cortado {
namespace {

LayerSpec Spec() {
  LayerSpec spec;
  spec.name = "twice";
  spec.type = "Twice";
  return spec;
}

template <typename T>
std::string Name() {
  if constexpr (std::is_same_v<T, OtherDTypes>) {
    return "other";
  } else {
    return DTypeName(DTypeOf<T>::value);
  }
}

// to = 2 * from, for any floating dtype (through f64, exact for these small integers).
void Twice(const Tensor& from, Tensor& to) {
  Tensor wide;
  wide.Resize(from.shape(), DType::kF64);
  wide.ConvertFrom(from);
  for (int64_t i = 0; i < wide.numel(); ++i) wide.data<double>()[i] *= 2;
  to.ConvertFrom(wide);
}

// y = 2 x on the blob lists (other dtypes: y = x); records which types its kernels ran for.
template <typename Types>
class TwiceLayer : public TypedLayer<TwiceLayer<Types>, Types> {
 public:
  using TypedLayer<TwiceLayer<Types>, Types>::TypedLayer;
  using Blobs = std::vector<Blob*>;
  void Reshape(const Blobs& bottom, const Blobs& top) override {
    top[0]->data.Resize(bottom[0]->data.shape(), bottom[0]->data.dtype());
  }
  std::vector<std::string> ran;

 private:
  friend TypedLayer<TwiceLayer<Types>, Types>;
  template <typename T>
  void ForwardT(const Blobs& bottom, const Blobs& top) {
    ran.push_back(Name<T>());
    if constexpr (std::is_same_v<T, OtherDTypes>) {
      top[0]->data = bottom[0]->data;
    } else {
      Twice(bottom[0]->data, top[0]->data);
    }
  }
  template <typename T>
  void BackwardT(const Blobs& top, const std::vector<bool>& propagate_down, const Blobs& bottom) {
    ran.push_back("back " + Name<T>());
    if (propagate_down[0]) Twice(top[0]->grad, bottom[0]->grad);
  }
};

// Runs forward (and backward for floating dtypes) on {1, 2, 3} in `dtype`; returns y.
template <typename Layer>
std::vector<double> RunTwice(Layer& layer, DType dtype) {
  Blob x{"x", Tensor(), Tensor()}, y{"y", Tensor(), Tensor()};
  x.data.Resize({3}, dtype);
  if (dtype == DType::kI32) {
    for (int i = 0; i < 3; ++i) x.data.template data<int32_t>()[i] = i + 1;
  } else {
    Tensor wide;
    wide.Resize({3}, DType::kF64);
    for (int i = 0; i < 3; ++i) wide.data<double>()[i] = i + 1;
    x.data.ConvertFrom(wide);
  }
  LayerContext context;
  layer.set_context(&context);
  std::vector<Blob*> bottom{&x}, top{&y};
  layer.SetUp(bottom, top);
  layer.Forward(bottom, top);
  std::vector<double> out;
  if (dtype == DType::kI32) {
    for (int i = 0; i < 3; ++i) out.push_back(y.data.template data<int32_t>()[i]);
    return out;
  }
  for (int i = 0; i < 3; ++i) out.push_back(ElementAsDouble(y.data, i));
  y.grad = y.data;
  x.grad.Resize({3}, dtype);
  layer.Backward(top, {true}, bottom);
  return out;
}

TEST(TypedLayer, NamedDTypesRunTheirKernel) {
  TwiceLayer<AllFloatTypes> layer(Spec());
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(RunTwice(layer, dtype), (std::vector<double>{2, 4, 6})) << DTypeName(dtype);
  }
  EXPECT_EQ(layer.ran, (std::vector<std::string>{"f32", "back f32", "f64", "back f64", "bf16",
                                                 "back bf16", "f16", "back f16"}));
}

TEST(TypedLayer, LowPrecisionOutsideTheListComputesInF32) {
  TwiceLayer<WideFloatTypes> layer(Spec());
  EXPECT_EQ(RunTwice(layer, DType::kBF16), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(RunTwice(layer, DType::kF16), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(layer.ran, (std::vector<std::string>{"f32", "back f32", "f32", "back f32"}));
}

TEST(TypedLayer, WideDTypeOutsideTheListFailsNamingTheLayer) {
  TwiceLayer<KernelTypes<float>> layer(Spec());
  try {
    RunTwice(layer, DType::kF64);
    FAIL() << "f64 ran without an f64 kernel";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'twice'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no f64 kernel"), std::string::npos) << e.what();
  }
}

TEST(TypedLayer, OtherDTypesOnlyWhenNamed) {
  TwiceLayer<AllFloatTypes> floats(Spec());
  EXPECT_THROW(RunTwice(floats, DType::kI32), std::exception);
  TwiceLayer<AllDTypes> any(Spec());
  EXPECT_EQ(RunTwice(any, DType::kI32), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(any.ran, (std::vector<std::string>{"other"}));
}

}  // namespace
}  // namespace cortado
