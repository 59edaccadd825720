// TransportCommunicator::HalvingDoublingAllReduce: recursive doubling for small vectors,
// Rabenseifner's recursive halving and doubling above, with the extra ranks of a world that is
// not a power of two paired off first.
#include <utility>
#include <vector>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

// Halving-doubling exchanges whole vectors (recursive doubling, log2(p) steps) at or below this
// size, where latency dominates; above it it halves them (Rabenseifner).
constexpr size_t kRecursiveDoublingBytes = 16 << 10;

void TransportCommunicator::HalvingDoublingAllReduce(char* data, size_t count, DataType type,
                                                     ReduceOp op, uint64_t seq, Deadline deadline) {
  const int n = size_, r = rank_;
  const size_t bytes = count * DataTypeSize(type);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  char* scratch = Scratch(bytes);
  Span user = Reg(data, bytes);
  // Non-power-of-two: the first 2*rem ranks pair up; odd ones hand their data to the even one
  // below and get the result back at the end.
  PowerOfTwoCore core{r - rem, p2, rem};
  if (r < 2 * rem) {
    if (r % 2 == 1) {
      RequestId s =
          transport_->PostSend(r - 1, *user.region, user.offset, bytes, MakeTag(seq, 0, 0));
      RequestId q =
          transport_->PostRecv(r - 1, *user.region, user.offset, bytes, MakeTag(seq, 200, 0));
      transport_->Wait(s, deadline);
      transport_->Wait(q, deadline);
      return;
    }
    const Span whole_scratch = ScratchSpan(scratch, bytes);
    RequestId q = transport_->PostRecv(r + 1, *whole_scratch.region, whole_scratch.offset, bytes,
                                       MakeTag(seq, 0, 0));
    transport_->Wait(q, deadline);
    Reduce(data, data, scratch, count, type, op);
    core.rank = r / 2;
  }
  if (p2 > 1 && bytes <= kRecursiveDoublingBytes) {
    RecursiveDoubling(data, count, type, op, core, seq, deadline);
  } else if (p2 > 1) {
    RabenseifnerAllReduce(data, count, type, op, core, seq, deadline);
  } else {
    Finalize(data, count, type, op, n);  // n == 1 + 1 extra rank: the pair's sum is final
  }
  if (r < 2 * rem) {
    RequestId s =
        transport_->PostSend(r + 1, *user.region, user.offset, bytes, MakeTag(seq, 200, 0));
    transport_->Wait(s, deadline);
  }
}

// Swaps whole vectors, log2(p2) steps; operands in rank order so both sides agree.
void TransportCommunicator::RecursiveDoubling(char* data, size_t count, DataType type, ReduceOp op,
                                              const PowerOfTwoCore& core, uint64_t seq,
                                              Deadline deadline) {
  const size_t bytes = count * DataTypeSize(type);
  char* scratch = Scratch(bytes);
  const Span user = Reg(data, bytes);
  uint32_t level = 1;
  for (int mask = 1; mask < core.p2; mask <<= 1, ++level) {
    const int partner = core.rank ^ mask;
    Exchange(core.Real(partner), user, ScratchSpan(scratch, bytes), MakeTag(seq, level, 0),
             deadline);
    if (core.rank < partner) {
      Reduce(data, data, scratch, count, type, op);
    } else {
      Reduce(data, scratch, data, count, type, op);
    }
  }
  Finalize(data, count, type, op, size_);
}

// Rabenseifner: reduce-scatter by recursive halving, then all-gather by recursive doubling.
void TransportCommunicator::RabenseifnerAllReduce(char* data, size_t count, DataType type,
                                                  ReduceOp op, const PowerOfTwoCore& core,
                                                  uint64_t seq, Deadline deadline) {
  const size_t esize = DataTypeSize(type);
  char* scratch = Scratch(count * esize);
  const Span user = Reg(data, count * esize);
  auto uspan = [&](size_t lo, size_t len) {
    return Span{user.region, user.offset + lo * esize, len * esize};
  };
  size_t lo = 0, hi = count;
  std::vector<std::pair<size_t, size_t>> stack;
  uint32_t level = 1;
  for (int mask = core.p2 / 2; mask >= 1; mask >>= 1, ++level) {
    const int partner = core.rank ^ mask;
    const size_t mid = lo + (hi - lo) / 2;
    const bool keep_lower = core.rank < partner;
    const size_t klo = keep_lower ? lo : mid, khi = keep_lower ? mid : hi;
    const size_t slo = keep_lower ? mid : lo, shi = keep_lower ? hi : mid;
    Exchange(core.Real(partner), uspan(slo, shi - slo), ScratchSpan(scratch, (khi - klo) * esize),
             MakeTag(seq, level, 0), deadline);
    Reduce(data + klo * esize, data + klo * esize, scratch, khi - klo, type, op);
    stack.emplace_back(lo, hi);
    lo = klo;
    hi = khi;
  }
  Finalize(data + lo * esize, hi - lo, type, op, size_);
  level = 100;
  for (int mask = 1; mask < core.p2; mask <<= 1, ++level) {
    auto [plo, phi] = stack.back();
    stack.pop_back();
    const int partner = core.rank ^ mask;
    const size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;
    Exchange(core.Real(partner), uspan(lo, hi - lo), uspan(olo, ohi - olo), MakeTag(seq, level, 0),
             deadline);
    lo = plo;
    hi = phi;
  }
}

}  // namespace cortado::dist::internal
