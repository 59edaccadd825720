// See matrix.h.
#include "matrix.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace cortado::dist::testing {
namespace {

constexpr size_t kLarge = (1u << 20) + 3;

std::vector<char> Make(DataType type, size_t count) {
  return std::vector<char>(count * DataTypeSize(type) + 8, 0);
}

void Store(std::vector<char>& buf, DataType type, size_t i, float v) {
  if (type == DataType::kF32) {
    std::memcpy(buf.data() + 4 * i, &v, 4);
  } else {
    uint16_t b = type == DataType::kF16 ? FloatToHalf(v) : FloatToBFloat16(v);
    std::memcpy(buf.data() + 2 * i, &b, 2);
  }
}

uint32_t Bits(const std::vector<char>& buf, DataType type, size_t i) {
  if (type == DataType::kF32) {
    uint32_t u;
    std::memcpy(&u, buf.data() + 4 * i, 4);
    return u;
  }
  uint16_t b;
  std::memcpy(&b, buf.data() + 2 * i, 2);
  return b;
}

uint32_t ExpectedBits(DataType type, float v) {
  if (type == DataType::kF32) return FloatToBits(v);
  return type == DataType::kF16 ? FloatToHalf(v) : FloatToBFloat16(v);
}

float Reduced(ReduceOp op, int n, size_t i, DataType type) {
  float sum = 0, mx = -1e30f;
  for (int r = 0; r < n; ++r) {
    float v = InputValue(r, i);
    sum += v;
    mx = std::max(mx, v);
  }
  if (op == ReduceOp::kMax) return mx;
  if (op == ReduceOp::kSum) return sum;
  // Average: the exact sum, rounded to the type, divided in f32 (as the library does).
  float s = type == DataType::kF32   ? sum
            : type == DataType::kF16 ? HalfToFloat(FloatToHalf(sum))
                                     : BFloat16ToFloat(FloatToBFloat16(sum));
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

}  // namespace

float InputValue(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 23) - 11);
}

std::vector<size_t> DefaultCounts() { return {0, 1, 17, 5003, kLarge}; }

std::vector<std::string> RunMatrix(Communicator& comm, const std::vector<size_t>& counts) {
  Checker check(comm);
  const int n = comm.size(), rank = comm.rank();
  const DataType kTypes[] = {DataType::kF32, DataType::kF16, DataType::kBF16};
  const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  for (size_t count : counts) {
    const bool large = count >= kLarge;
    auto label = [&](const char* op, const std::string& rest) {
      return std::string(op) + " count=" + std::to_string(count) + " " + rest;
    };
    // --- all-reduce: both algorithms, every type and reduction (fewer pairs when large).
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
      for (DataType type : kTypes) {
        for (ReduceOp op : kOps) {
          if (large && type != DataType::kF32 &&
              !(type == DataType::kF16 && op == ReduceOp::kSum) &&
              !(type == DataType::kBF16 && op == ReduceOp::kMax)) {
            continue;
          }
          std::string what = label("allreduce", std::string(AlgorithmName(algo)) + " " +
                                                    DataTypeName(type) + " " + ReduceOpName(op));
          auto buf = Make(type, count);
          for (size_t i = 0; i < count; ++i) Store(buf, type, i, InputValue(rank, i));
          comm.AllReduce(buf.data(), count, type, op, algo);
          for (size_t i = 0; i < count; ++i) {
            uint32_t want = ExpectedBits(type, Reduced(op, n, i, type));
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
    // --- broadcast: both algorithms, first and last root.
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree}) {
      for (int root : {0, n - 1}) {
        for (DataType type : {DataType::kF32, DataType::kBF16}) {
          if (large && type != DataType::kF32) continue;
          if (root == n - 1 && n == 1) continue;
          std::string what =
              label("broadcast", std::string(AlgorithmName(algo)) + " root " +
                                     std::to_string(root) + " " + DataTypeName(type));
          auto buf = Make(type, count);
          for (size_t i = 0; i < count; ++i) {
            Store(buf, type, i, rank == root ? InputValue(root, i) : -99.0f);
          }
          comm.Broadcast(buf.data(), count, type, root, algo);
          for (size_t i = 0; i < count; ++i) {
            if (Bits(buf, type, i) != ExpectedBits(type, InputValue(root, i))) {
              check.Failed(what + ": element " + std::to_string(i) + " wrong");
              break;
            }
          }
        }
      }
    }
    // --- all-gather: separate buffers and in place.
    for (DataType type : {DataType::kF32, DataType::kF16}) {
      for (bool in_place : {false, true}) {
        if (large && (type != DataType::kF32 || in_place)) continue;
        std::string what =
            label("allgather", std::string(DataTypeName(type)) + (in_place ? " in place" : ""));
        auto in = Make(type, count);
        auto out = Make(type, count * static_cast<size_t>(n));
        for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) Store(out, type, i, -99.0f);
        for (size_t i = 0; i < count; ++i) Store(in, type, i, InputValue(rank, i));
        const char* src = in.data();
        if (in_place) {
          char* mine = out.data() + static_cast<size_t>(rank) * count * DataTypeSize(type);
          std::memcpy(mine, in.data(), count * DataTypeSize(type));
          src = mine;
        }
        comm.AllGather(src, out.data(), count, type);
        for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) {
          if (Bits(out, type, i) !=
              ExpectedBits(type, InputValue(static_cast<int>(i / count), i % count))) {
            check.Failed(what + ": element " + std::to_string(i) + " wrong");
            break;
          }
        }
      }
    }
    // --- reduce-scatter: rank r gets slice r of the reduction.
    for (DataType type : kTypes) {
      for (ReduceOp op : kOps) {
        if (type != DataType::kF32 && op == ReduceOp::kAvg) continue;
        if (large && !(type == DataType::kF32 && op == ReduceOp::kSum)) continue;
        std::string what =
            label("reducescatter", std::string(DataTypeName(type)) + " " + ReduceOpName(op));
        size_t total = count * static_cast<size_t>(n);
        auto in = Make(type, total);
        auto out = Make(type, count);
        for (size_t i = 0; i < total; ++i) Store(in, type, i, InputValue(rank, i));
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
          if (Bits(in, type, i) != ExpectedBits(type, InputValue(rank, i))) {
            check.Failed(what + ": input modified");
            break;
          }
        }
      }
    }
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
                FloatToBits(Reduced(ReduceOp::kSum, n, i, DataType::kF32)) ||
            Bits(c, DataType::kF32, i) !=
                FloatToBits(Reduced(ReduceOp::kSum, n, i + 2, DataType::kF32))) {
          check.Failed(label("async", "wrong sum at " + std::to_string(i)));
          break;
        }
        if (Bits(b, DataType::kF32, i) !=
            FloatToBits(Reduced(ReduceOp::kMax, n, i + 1, DataType::kF32))) {
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
