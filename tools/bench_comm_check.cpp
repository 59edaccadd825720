// `cortado bench comm` (bench_comm.h): what its results are checked against. --check fills every
// rank's buffer with known data and compares one result per size with the value expected; with
// --codec the all-reduce of random-like gradients is compared with their exact average (f64).
#include <algorithm>
#include <cmath>

#include "engine/base/error.h"
#include "tools/bench_comm.h"

namespace cortado::tools::bench_comm {
namespace {

// Random-like gradients: per element a sign and a magnitude between 2^-12 and 2^-5 shared by the
// ranks, each rank within +-25% of it, so the exact sum is well conditioned and the relative
// error measures the codec (with cancelling values it would measure the cancellation).
// Deterministic in rank and index, so every rank can compute the exact result.
uint32_t Mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  return h ^ (h >> 16);
}

float CodecInput(int rank, size_t i) {
  const uint32_t h = Mix(static_cast<uint32_t>(i));
  const float unit = static_cast<float>(h % 20001u) / 20000.0f + 0.5f;  // [0.5, 1.5]
  const float base = std::ldexp(h & 1u ? unit : -unit, static_cast<int>(h >> 29) - 12);
  const uint32_t g =
      Mix(static_cast<uint32_t>(i) ^ (static_cast<uint32_t>(rank) + 1) * 0x9e3779b9u);
  return base * (1.0f + 0.25f * (static_cast<float>(g % 20001u) / 10000.0f - 1.0f));
}

float ValueAt(const Buffer& buf, dist::DataType type, size_t i) {
  if (type == dist::DataType::kF32) return reinterpret_cast<const float*>(buf.data())[i];
  uint16_t b = reinterpret_cast<const uint16_t*>(buf.data())[i];
  return type == dist::DataType::kF16 ? dist::HalfToFloat(b) : dist::BFloat16ToFloat(b);
}

// Element i of the result when every rank's input is Fill's.
float ExpectedValue(const Bench& b, size_t count, size_t i) {
  const std::string& op = b.a.op;
  if (op == "broadcast") return static_cast<float>(i % 7);
  if (op == "allgather") return static_cast<float>((i % count + i / count) % 7);
  size_t base = op == "reducescatter" ? i + static_cast<size_t>(b.rank) * count : i;
  float sum = 0, mx = 0;
  for (int r = 0; r < b.n; ++r) {
    float v = static_cast<float>((base + static_cast<size_t>(r)) % 7);
    sum += v;
    mx = std::max(mx, v);
  }
  const dist::ReduceOp rop = b.plan.rop;
  return rop == dist::ReduceOp::kMax ? mx : rop == dist::ReduceOp::kAvg ? sum / b.n : sum;
}

}  // namespace

void Fill(Buffer& buf, dist::DataType type, int rank) {
  size_t count = buf.size() / dist::DataTypeSize(type);
  for (size_t i = 0; i < count; ++i) {
    float v = static_cast<float>((i + static_cast<size_t>(rank)) % 7);
    if (type == dist::DataType::kF32) {
      reinterpret_cast<float*>(buf.data())[i] = v;
    } else if (type == dist::DataType::kF16) {
      reinterpret_cast<uint16_t*>(buf.data())[i] = dist::FloatToHalf(v);
    } else {
      reinterpret_cast<uint16_t*>(buf.data())[i] = dist::FloatToBFloat16(v);
    }
  }
}

// --check: one verified run on known data before timing.
void CheckResult(Bench& b, size_t count, size_t bytes) {
  const std::string& op = b.a.op;
  Fill(b.in, b.plan.type, b.rank);
  RunOnce(b, count);
  const Buffer& res = (op == "allgather" || op == "reducescatter") ? b.out : b.in;
  size_t check_count = op == "allgather" ? count * static_cast<size_t>(b.n) : count;
  for (size_t i = 0; i < check_count; ++i) {
    const float want = ExpectedValue(b, count, i);
    float got = ValueAt(res, b.plan.type, i);
    if (std::fabs(got - want) > 1e-2f * std::max(1.0f, std::fabs(want))) {
      Fail("bench comm --check: ", op, " of ", bytes, " bytes: element ", i, " is ", got,
           ", expected ", want, " (rank ", b.rank, ")");
    }
  }
}

// Accuracy against the exact average of random-like inputs, before timing.
CodecError MeasureCodecError(Bench& b, size_t count) {
  float* x = reinterpret_cast<float*>(b.in.data());
  for (size_t i = 0; i < count; ++i) x[i] = CodecInput(b.rank, i);
  RunOnce(b, count);
  double max_rel = 0, sum_rel = 0;
  size_t counted = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < b.n; ++r) exact += CodecInput(r, i);
    exact = b.plan.rop == dist::ReduceOp::kAvg ? exact / b.n : exact;
    if (exact == 0) continue;
    const double rel = std::fabs(x[i] - exact) / std::fabs(exact);
    max_rel = std::max(max_rel, rel);
    sum_rel += rel;
    ++counted;
  }
  CodecError e;
  e.max = max_rel;
  e.mean = counted ? sum_rel / static_cast<double>(counted) : 0;
  b.comm.AllReduce(&e.max, 1, dist::DataType::kF64, dist::ReduceOp::kMax);
  return e;
}

}  // namespace cortado::tools::bench_comm
