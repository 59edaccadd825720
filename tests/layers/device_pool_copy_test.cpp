// Pooling, Concat, Split, Flatten and Reshape on the guarded test device equal the CPU bit for
// bit through their own device paths (tests/layers/pool_copy_checks.h).
#include <gtest/gtest.h>

#include "tests/layers/pool_copy_checks.h"

namespace cortado::testing::pool_copy {
namespace {

const Device kTest0{DeviceType::kTest, 0};

TEST(DevicePoolCopy, PoolingEqualsTheCpuInEveryModeFormatAndDtype) { CheckPooling(kTest0); }
TEST(DevicePoolCopy, InferenceNetsShareTheArgmaxOnTheDevice) {
  CheckPoolingWithSharedScratch(kTest0);
}
TEST(DevicePoolCopy, MaxPoolingRoutesNaNAsTheCpu) { CheckMaxPoolingNaN(kTest0); }
TEST(DevicePoolCopy, ConcatEqualsTheCpuOnEveryAxisFormatAndDtype) { CheckConcat(kTest0); }
TEST(DevicePoolCopy, ConcatOfBytesEqualsTheCpu) { CheckConcatOfBytes(kTest0); }
TEST(DevicePoolCopy, SplitSumsTheTopsGradientsAsTheCpu) { CheckSplit(kTest0); }
TEST(DevicePoolCopy, FlattenAndReshapeViewForwardAndCopyBackward) {
  CheckFlattenAndReshape(kTest0);
}

}  // namespace
}  // namespace cortado::testing::pool_copy
