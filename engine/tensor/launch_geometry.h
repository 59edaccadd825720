// The shape of RunIndexed's CUDA launch (engine/cuda/indexed_launch.cuh), apart so that nvcc
// compiles no engine header with it and the host tests check the rule.
#pragma once

#include <cstdint>

namespace cortado {

// A CUDA launch's shape for n indices: blocks of 256 threads, one index per thread up to 65536
// blocks (16.7 M indices), beyond which each thread strides over several (the kernel is a
// grid-stride loop, so any n is covered). A pure function, so its rule is tested on the host.
struct LaunchGeometry {
  int blocks = 1;
  int threads = 256;
};
constexpr LaunchGeometry IndexedLaunchGeometry(int64_t n) {
  constexpr int64_t kThreads = 256, kMaxBlocks = 65536;
  const int64_t wanted = n <= 0 ? 1 : (n + kThreads - 1) / kThreads;
  return LaunchGeometry{static_cast<int>(wanted < kMaxBlocks ? wanted : kMaxBlocks),
                        static_cast<int>(kThreads)};
}

}  // namespace cortado
