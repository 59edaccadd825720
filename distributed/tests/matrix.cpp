// See matrix.h.
#include "matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace cortado::dist::testing {
namespace {

// Counts from kLargeFrom up run fewer type and reduction pairs: each pair is a full pass of
// reference arithmetic over every element, which dominates the matrix's time.
constexpr size_t kLargeFrom = size_t{1} << 17;
constexpr size_t kDefaultLarge = (size_t{1} << 20) + 3;

std::vector<char> Make(DataType type, size_t count) {
  return std::vector<char>(count * DataTypeSize(type) + 8, 0);
}

// What rank r contributes at element i as `type`. f64 adds fine bits (multiples of 2^-40) that
// f32 cannot hold, so an f64 path that narrowed anything would fail; every partial sum of them
// is still exact in f64 (magnitudes stay below 64), so sums do not depend on the order.
double Value(DataType type, int rank, size_t i) {
  double v = InputValue(rank, i);
  if (type == DataType::kF64) v += std::ldexp(static_cast<double>((rank + 1) * (i % 7 + 1)), -40);
  return v;
}

void Store(std::vector<char>& buf, DataType type, size_t i, double v) {
  switch (type) {
    case DataType::kF32: {
      float f = static_cast<float>(v);
      std::memcpy(buf.data() + 4 * i, &f, 4);
      return;
    }
    case DataType::kF64:
      std::memcpy(buf.data() + 8 * i, &v, 8);
      return;
    case DataType::kF16:
    case DataType::kBF16: {
      float f = static_cast<float>(v);
      uint16_t b = type == DataType::kF16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(buf.data() + 2 * i, &b, 2);
      return;
    }
  }
}

// The element's bits, zero-extended.
uint64_t Bits(const std::vector<char>& buf, DataType type, size_t i) {
  const size_t esize = DataTypeSize(type);
  uint64_t u = 0;
  std::memcpy(&u, buf.data() + esize * i, esize);  // little-endian: the low bytes
  return u;
}

uint64_t ExpectedBits(DataType type, double v) {
  switch (type) {
    case DataType::kF32:
      return FloatToBits(static_cast<float>(v));
    case DataType::kF64: {
      uint64_t u;
      std::memcpy(&u, &v, 8);
      return u;
    }
    case DataType::kF16:
      return FloatToHalf(static_cast<float>(v));
    case DataType::kBF16:
      return FloatToBFloat16(static_cast<float>(v));
  }
  return 0;
}

double Reduced(ReduceOp op, int n, size_t i, DataType type) {
  double sum = 0, mx = -1e30;
  for (int r = 0; r < n; ++r) {
    double v = Value(type, r, i);
    sum += v;  // exact: small integers (plus, for f64, fine bits; see Value)
    mx = std::max(mx, v);
  }
  if (op == ReduceOp::kMax) return mx;
  if (op == ReduceOp::kSum) return sum;
  // Average: the exact sum, rounded to the type, divided once in the type's arithmetic (f32 for
  // the 16-bit types), as the library does.
  if (type == DataType::kF64) return sum / n;
  float f = static_cast<float>(sum);
  float s = type == DataType::kF32   ? f
            : type == DataType::kF16 ? HalfToFloat(FloatToHalf(f))
                                     : BFloat16ToFloat(FloatToBFloat16(f));
  return s / static_cast<float>(n);
}

uint64_t Hash(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

class Checker {
 public:
  explicit Checker(Communicator& comm) : comm_(comm) {}

  // Every rank must hold exactly the same bytes.
  void Identical(const std::string& what, const char* p, size_t bytes) {
    uint64_t h = Hash(p, bytes);
    std::vector<uint64_t> all(static_cast<size_t>(comm_.size()));
    comm_.AllGather(&h, all.data(), 2, DataType::kF32);  // 8 raw bytes per rank
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r] != all[0]) {
        Failed(what + ": rank " + std::to_string(r) + "'s result differs bitwise from rank 0's");
        return;
      }
    }
  }

  void Failed(const std::string& line) {
    if (failures_.size() < 20)
      failures_.push_back("rank " + std::to_string(comm_.rank()) + ": " + line);
  }

  std::vector<std::string> failures_;

 private:
  Communicator& comm_;
};

// What rank r contributes to the compressed all-reduces: values of both signs over several
// binary orders of magnitude, none of them exact in the narrow formats.
float CompressedInput(int rank, size_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u + static_cast<uint32_t>(rank) * 40503u;
  h ^= h >> 15;
  float unit = static_cast<float>(h % 20001u) / 10000.0f - 1.0f;  // [-1, 1]
  return std::ldexp(unit, static_cast<int>(h >> 28) % 6 - 2);     // times 2^-2 .. 2^3
}

// The random stream of one encoding site: rank `rank` at ring step `step` (the library's
// seeds, src/reduce.h's HopSeed, restated so that the simulation below stands on its own).
uint64_t RingHopSeed(uint64_t seed, int rank, int step) {
  uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(rank) + 1));
  h ^= 0xbf58476d1ce4e5b9ull * (static_cast<uint64_t>(step) + 1);
  return h ^ (h >> 31);
}

// The compressed ring all-reduce of all n ranks' values, simulated in one process with the
// codec's scalar reference (EncodeValue, DecodeValue, StochasticBits): what every rank must
// hold afterwards, bit for bit, and each rank's residual. Each rank starts from x = value *
// scale + residual (the residual then 0). Element i lies in segment s (Communicator's split of
// count into n near-equal segments, the first count % n one longer); in reduce-scatter step t
// (0..n-2) rank s+t encodes its partial sum with the stream of (rank s+t, step t) and rank
// s+t+1 adds the decoded value to its own x; rank s+n-1 completes the sum and encodes it once
// (stream of its own rank, step n-2), and everyone decodes those bits. Every encoding adds what
// it lost to its rank's residual (nothing where a value is not finite). One rank encodes
// nothing.
struct SimulatedRing {
  std::vector<float> result;
  std::vector<std::vector<float>> residuals;  // per rank
};
SimulatedRing SimulateCompressedRing(const std::vector<std::vector<float>>& values,
                                     const std::vector<std::vector<float>>* residuals, float scale,
                                     const Compression& c) {
  const int n = static_cast<int>(values.size());
  const size_t count = values[0].size();
  SimulatedRing out;
  out.result.resize(count);
  out.residuals.assign(static_cast<size_t>(n), std::vector<float>(count, 0.0f));
  const size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
  for (size_t i = 0; i < count; ++i) {
    auto x = [&](int r) {
      const float v = values[static_cast<size_t>(r)][i];
      if (n == 1) return residuals ? v + (*residuals)[0][i] : v;
      // Rounded before the sum, as the library does (volatile: no fused multiply-add here).
      volatile float scaled = v * scale;
      return residuals ? scaled + (*residuals)[static_cast<size_t>(r)][i] : scaled;
    };
    if (n == 1) {
      out.result[i] = x(0);
      continue;
    }
    // Encodes v at rank r's step t; returns the decoded value and adds the loss to r's residual.
    auto hop = [&](float v, int r, int t) {
      const uint32_t random = StochasticBits(RingHopSeed(c.seed, r, t), i);
      const float d = DecodeValue(c.codec, EncodeValue(c.codec, v, c.rounding, random));
      float& res = out.residuals[static_cast<size_t>(r)][i];
      if (std::isfinite(v) && std::isfinite(d)) res = res + (v - d);
      return d;
    };
    const int s = static_cast<int>(
        i < extra * (base + 1) ? i / (base + 1) : extra + (i - extra * (base + 1)) / base);
    float partial = x(s);
    for (int t = 0; t <= n - 2; ++t) {
      const int sender = (s + t) % n, receiver = (s + t + 1) % n;
      partial = x(receiver) + hop(partial, sender, t);
    }
    out.result[i] = hop(partial, (s + n - 1) % n, n - 2);
  }
  return out;
}

// Bitwise equal, or both NaN (whose payload the formats do not keep alike).
bool SameFloat(float a, float b) {
  return FloatToBits(a) == FloatToBits(b) || (std::isnan(a) && std::isnan(b));
}

// The compressed ring: every codec, rounding and reduction, with and without error feedback.
// The result must be bitwise identical on every rank and bitwise what the one-process
// simulation of the same ring (hop order, codec, rounding, seeds) gives, and so must each
// rank's error-feedback residual. Overflow must survive the reduction.
template <typename Label>
void CompressedAllReduces(Communicator& comm, Checker& check, size_t count, Label label) {
  const int n = comm.size(), rank = comm.rank();
  const bool large = count >= kLargeFrom;
  for (CodecKind codec : {CodecKind::kF16, CodecKind::kBF16, CodecKind::kEpgc11, CodecKind::kEpgc9,
                          CodecKind::kEpgc8}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kTruncate, Rounding::kStochastic}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (bool feedback : {false, true}) {
          if (large && (rounding != Rounding::kNearest || op != ReduceOp::kAvg || !feedback)) {
            continue;
          }
          if (rounding != Rounding::kNearest && op == ReduceOp::kSum) continue;
          std::string what =
              label("allreduce", std::string("compressed ") + CodecName(codec) + " " +
                                     RoundingName(rounding) + " " + ReduceOpName(op) +
                                     (feedback ? " error-feedback" : ""));
          const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(n) : 1.0f;
          // Every rank's input and residual (each rank simulates the whole ring).
          std::vector<std::vector<float>> values(static_cast<size_t>(n), std::vector<float>(count)),
              residuals = values;
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < count; ++i) {
              values[static_cast<size_t>(q)][i] = CompressedInput(q, i);
              // A residual from an earlier step, added before encoding.
              residuals[static_cast<size_t>(q)][i] = CompressedInput(q + 7, i) * 0x1p-8f;
            }
          }
          // Overflow must survive the reduction (a loss scaler skips such a step): rank 0's
          // infinity, the last rank's NaN and a finite value beyond the format's range.
          const bool specials = count >= 17 && !feedback && op == ReduceOp::kAvg;
          auto special = [&](size_t i) { return specials && (i == 3 || i == 5 || i == 9); };
          if (specials) {
            values[0][3] = INFINITY;
            values[static_cast<size_t>(n - 1)][5] = NAN;
            values[static_cast<size_t>(n - 1)][9] =
                CodecMaxFinite(codec) * 4.0f * static_cast<float>(n);
          }
          std::vector<float> data(values[static_cast<size_t>(rank)]), residual;
          data.resize(count + 2, 0.0f);
          if (feedback) residual = residuals[static_cast<size_t>(rank)];
          Compression compression;
          compression.codec = codec;
          compression.rounding = rounding;
          compression.seed = 1234 + count;
          compression.residual = feedback ? residual.data() : nullptr;
          comm.AllReduceCompressed(data.data(), count, op, compression);
          for (size_t i = 0; i < count; ++i) {
            // (One rank encodes nothing: its out-of-range finite value stays finite.)
            if (special(i) && std::isfinite(data[i]) && !(n == 1 && i == 9)) {
              check.Failed(what + ": element " + std::to_string(i) + " became finite (" +
                           std::to_string(data[i]) + ")");
            }
          }
          if (data[count] != 0.0f) check.Failed(what + ": wrote past the end");
          check.Identical(what, reinterpret_cast<const char*>(data.data()), count * 4);
          const SimulatedRing want =
              SimulateCompressedRing(values, feedback ? &residuals : nullptr, scale, compression);
          for (size_t i = 0; i < count; ++i) {
            if (!SameFloat(data[i], want.result[i])) {
              check.Failed(what + ": element " + std::to_string(i) + " is " +
                           std::to_string(data[i]) + ", the simulated ring gives " +
                           std::to_string(want.result[i]));
              break;
            }
          }
          for (size_t i = 0; feedback && i < count; ++i) {
            const float sim = want.residuals[static_cast<size_t>(rank)][i];
            if (!SameFloat(residual[i], sim)) {
              check.Failed(what + ": element " + std::to_string(i) + ": residual " +
                           std::to_string(residual[i]) + ", the simulated ring leaves " +
                           std::to_string(sim));
              break;
            }
          }
        }
      }
    }
  }
}

// What rank r contributes to the registered-memory all-reduces: values of both signs over
// several binary orders of magnitude, whose sums round differently in different orders.
double RoundingInput(int rank, size_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2246822519u + static_cast<uint32_t>(rank) * 3266489917u;
  h ^= h >> 13;
  h *= 668265263u;
  h ^= h >> 16;
  double unit = static_cast<double>(h % 1000003u) / 500001.5 - 1.0;  // [-1, 1]
  return std::ldexp(unit, static_cast<int>(h >> 28) % 9 - 4);
}

}  // namespace

float InputValue(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 23) - 11);
}

std::vector<size_t> DefaultCounts() {
  size_t large = kDefaultLarge;
  if (const char* text = std::getenv("CORTADO_TEST_LARGE_COUNT"); text && *text) {
    char* end = nullptr;
    unsigned long long parsed = std::strtoull(text, &end, 10);
    if (*end != '\0' || parsed < kLargeFrom) {
      std::fprintf(stderr, "CORTADO_TEST_LARGE_COUNT='%s': want a count of at least %zu\n", text,
                   kLargeFrom);
      std::abort();
    }
    large = static_cast<size_t>(parsed);
  }
  return {0, 1, 17, 5003, large};
}

std::vector<std::string> RunMatrix(Communicator& comm, const std::vector<size_t>& counts) {
  Checker check(comm);
  const int n = comm.size(), rank = comm.rank();
  // Whether this communicator runs the direct all-reduce on registered memory (ranks sharing
  // memory): then the registered cases below force it at every count.
  bool direct_possible = false;
  {
    auto probe = comm.AllocateRegistered(1 << 20);
    direct_possible =
        comm.AllReduceAlgorithmFor(1 << 20, Algorithm::kAuto, probe->data()) == "direct";
  }
  const DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBF16, DataType::kF64};
  const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  for (size_t count : counts) {
    const bool large = count >= kLargeFrom;
    auto label = [&](const char* op, const std::string& rest) {
      return std::string(op) + " count=" + std::to_string(count) + " " + rest;
    };
    // --- all-reduce: both algorithms, every type and reduction (fewer pairs when large).
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
      for (DataType type : kTypes) {
        for (ReduceOp op : kOps) {
          if (large && type != DataType::kF32 &&
              !(type == DataType::kF16 && op == ReduceOp::kSum) &&
              !(type == DataType::kBF16 && op == ReduceOp::kMax) &&
              !(type == DataType::kF64 && op == ReduceOp::kAvg)) {
            continue;
          }
          std::string what = label("allreduce", std::string(AlgorithmName(algo)) + " " +
                                                    DataTypeName(type) + " " + ReduceOpName(op));
          auto buf = Make(type, count);
          for (size_t i = 0; i < count; ++i) Store(buf, type, i, Value(type, rank, i));
          comm.AllReduce(buf.data(), count, type, op, algo);
          for (size_t i = 0; i < count; ++i) {
            uint64_t want = ExpectedBits(type, Reduced(op, n, i, type));
            if (Bits(buf, type, i) != want) {
              check.Failed(what + ": element " + std::to_string(i) + " wrong");
              break;
            }
          }
          if (buf[count * DataTypeSize(type)] != 0) check.Failed(what + ": wrote past the end");
          check.Identical(what, buf.data(), count * DataTypeSize(type));
        }
      }
    }
    // --- all-reduce of registered memory (AllocateRegistered): forced 'direct' where the ranks
    // share memory (UCX on one host), else the ring on it, must give bitwise the ring's result
    // on plain memory, for inputs whose sums depend on the order of addition. One region per
    // count, reused (as the trainer reuses its gradient block), so peers map it once.
    {
      auto memory = comm.AllocateRegistered(count * 8 + 8);
      const Algorithm algo = direct_possible ? Algorithm::kDirect : Algorithm::kRing;
      const std::pair<DataType, ReduceOp> cases[] = {
          {DataType::kF32, ReduceOp::kSum},  {DataType::kF32, ReduceOp::kAvg},
          {DataType::kF32, ReduceOp::kMax},  {DataType::kF16, ReduceOp::kSum},
          {DataType::kBF16, ReduceOp::kAvg}, {DataType::kF64, ReduceOp::kSum}};
      for (const auto& [type, op] : cases) {
        if (large && !(type == DataType::kF32 && op == ReduceOp::kAvg) &&
            !(type == DataType::kF16 && op == ReduceOp::kSum)) {
          continue;
        }
        std::string what =
            label("allreduce", std::string("registered ") + AlgorithmName(algo) + " " +
                                   DataTypeName(type) + " " + ReduceOpName(op));
        const size_t esize = DataTypeSize(type);
        char* reg = static_cast<char*>(memory->data());
        auto plain = Make(type, count);
        for (size_t i = 0; i < count; ++i) Store(plain, type, i, RoundingInput(rank, i));
        std::memcpy(reg, plain.data(), count * esize + 8);  // with the zeroed sentinel after it
        comm.AllReduce(plain.data(), count, type, op, Algorithm::kRing);
        comm.AllReduce(reg, count, type, op, algo);
        if (std::memcmp(reg, plain.data(), count * esize) != 0) {
          check.Failed(what + ": differs bitwise from the ring's result");
        }
        if (std::any_of(reg + count * esize, reg + count * esize + 8, [](char c) { return c; })) {
          check.Failed(what + ": wrote past the end");
        }
        check.Identical(what, reg, count * esize);
      }
    }
    // --- broadcast: both algorithms, first and last root.
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree}) {
      for (int root : {0, n - 1}) {
        for (DataType type : {DataType::kF32, DataType::kBF16, DataType::kF64}) {
          if (large && type != DataType::kF32) continue;
          if (root == n - 1 && n == 1) continue;
          std::string what =
              label("broadcast", std::string(AlgorithmName(algo)) + " root " +
                                     std::to_string(root) + " " + DataTypeName(type));
          auto buf = Make(type, count);
          for (size_t i = 0; i < count; ++i) {
            Store(buf, type, i, rank == root ? Value(type, root, i) : -99.0);
          }
          comm.Broadcast(buf.data(), count, type, root, algo);
          for (size_t i = 0; i < count; ++i) {
            if (Bits(buf, type, i) != ExpectedBits(type, Value(type, root, i))) {
              check.Failed(what + ": element " + std::to_string(i) + " wrong");
              break;
            }
          }
        }
      }
    }
    // --- all-gather: separate buffers and in place.
    for (DataType type : {DataType::kF32, DataType::kF16, DataType::kF64}) {
      for (bool in_place : {false, true}) {
        if (large && (type != DataType::kF32 || in_place)) continue;
        std::string what =
            label("allgather", std::string(DataTypeName(type)) + (in_place ? " in place" : ""));
        auto in = Make(type, count);
        auto out = Make(type, count * static_cast<size_t>(n));
        for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) Store(out, type, i, -99.0);
        for (size_t i = 0; i < count; ++i) Store(in, type, i, Value(type, rank, i));
        const char* src = in.data();
        if (in_place) {
          char* mine = out.data() + static_cast<size_t>(rank) * count * DataTypeSize(type);
          std::memcpy(mine, in.data(), count * DataTypeSize(type));
          src = mine;
        }
        comm.AllGather(src, out.data(), count, type);
        for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) {
          if (Bits(out, type, i) !=
              ExpectedBits(type, Value(type, static_cast<int>(i / count), i % count))) {
            check.Failed(what + ": element " + std::to_string(i) + " wrong");
            break;
          }
        }
      }
    }
    // --- reduce-scatter: rank r gets slice r of the reduction.
    for (DataType type : kTypes) {
      for (ReduceOp op : kOps) {
        if ((type == DataType::kF16 || type == DataType::kBF16) && op == ReduceOp::kAvg) continue;
        if (large && !(type == DataType::kF32 && op == ReduceOp::kSum)) continue;
        std::string what =
            label("reducescatter", std::string(DataTypeName(type)) + " " + ReduceOpName(op));
        size_t total = count * static_cast<size_t>(n);
        auto in = Make(type, total);
        auto out = Make(type, count);
        for (size_t i = 0; i < total; ++i) Store(in, type, i, Value(type, rank, i));
        comm.ReduceScatter(in.data(), out.data(), count, type, op);
        for (size_t i = 0; i < count; ++i) {
          size_t g = static_cast<size_t>(rank) * count + i;
          if (Bits(out, type, i) != ExpectedBits(type, Reduced(op, n, g, type))) {
            check.Failed(what + ": element " + std::to_string(i) + " wrong");
            break;
          }
        }
        // The input is read-only.
        for (size_t i = 0; i < total; ++i) {
          if (Bits(in, type, i) != ExpectedBits(type, Value(type, rank, i))) {
            check.Failed(what + ": input modified");
            break;
          }
        }
      }
    }
    CompressedAllReduces(comm, check, count, label);
    comm.Barrier();
    // --- asynchronous all-reduces in flight together, then a synchronous one behind them.
    if (!large) {
      auto a = Make(DataType::kF32, count), b = Make(DataType::kF32, count),
           c = Make(DataType::kF32, count);
      for (size_t i = 0; i < count; ++i) {
        Store(a, DataType::kF32, i, InputValue(rank, i));
        Store(b, DataType::kF32, i, InputValue(rank, i + 1));
        Store(c, DataType::kF32, i, InputValue(rank, i + 2));
      }
      auto wa = comm.AllReduceAsync(a.data(), count, DataType::kF32, ReduceOp::kSum);
      auto wb = comm.AllReduceAsync(b.data(), count, DataType::kF32, ReduceOp::kMax);
      comm.AllReduce(c.data(), count, DataType::kF32, ReduceOp::kSum);
      if (!wa->Test() || !wb->Test())
        check.Failed(label("async", "queued work ran after a sync op"));
      wa->Wait();
      wb->Wait();
      for (size_t i = 0; i < count; ++i) {
        if (Bits(a, DataType::kF32, i) !=
                ExpectedBits(DataType::kF32, Reduced(ReduceOp::kSum, n, i, DataType::kF32)) ||
            Bits(c, DataType::kF32, i) !=
                ExpectedBits(DataType::kF32, Reduced(ReduceOp::kSum, n, i + 2, DataType::kF32))) {
          check.Failed(label("async", "wrong sum at " + std::to_string(i)));
          break;
        }
        if (Bits(b, DataType::kF32, i) !=
            ExpectedBits(DataType::kF32, Reduced(ReduceOp::kMax, n, i + 1, DataType::kF32))) {
          check.Failed(label("async", "wrong max at " + std::to_string(i)));
          break;
        }
      }
      comm.BarrierAsync()->Wait();
    }
  }
  return check.failures_;
}

}  // namespace cortado::dist::testing
