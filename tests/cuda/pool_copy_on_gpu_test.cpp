// Pooling, Concat, Split, Flatten and Reshape on a GPU equal the CPU bit for bit through their
// own device paths (tests/layers/pool_copy_checks.h: the checks the test device runs in
// test_layers). Labeled `cuda`; every test skips, saying why, where there is no usable GPU.
#include <gtest/gtest.h>

#include <string>

#include "tests/layers/pool_copy_checks.h"

namespace cortado::testing::pool_copy {
namespace {

const Device kGpu{DeviceType::kCUDA, 0};

class PoolCopyOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceUsable(kGpu, &why)) GTEST_SKIP() << why;
  }
};

TEST_F(PoolCopyOnGpu, PoolingEqualsTheCpuInEveryModeFormatAndDtype) { CheckPooling(kGpu); }
TEST_F(PoolCopyOnGpu, InferenceNetsShareTheArgmaxOnTheDevice) {
  CheckPoolingWithSharedScratch(kGpu);
}
TEST_F(PoolCopyOnGpu, MaxPoolingRoutesNaNAsTheCpu) { CheckMaxPoolingNaN(kGpu); }
TEST_F(PoolCopyOnGpu, ConcatEqualsTheCpuOnEveryAxisFormatAndDtype) { CheckConcat(kGpu); }
TEST_F(PoolCopyOnGpu, ConcatOfBytesEqualsTheCpu) { CheckConcatOfBytes(kGpu); }
TEST_F(PoolCopyOnGpu, SplitSumsTheTopsGradientsAsTheCpu) { CheckSplit(kGpu); }
TEST_F(PoolCopyOnGpu, FlattenAndReshapeViewForwardAndCopyBackward) { CheckFlattenAndReshape(kGpu); }

}  // namespace
}  // namespace cortado::testing::pool_copy
