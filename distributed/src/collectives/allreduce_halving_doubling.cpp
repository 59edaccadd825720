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
  const size_t esize = DataTypeSize(type);
  const size_t bytes = count * esize;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  char* scratch = Scratch(bytes);
  Span user = Reg(data, bytes);
  auto uspan = [&](size_t lo, size_t len) {
    return Span{user.region, user.offset + lo * esize, len * esize};
  };
  Span whole_scratch = ScratchSpan(scratch, bytes);
  // Non-power-of-two: the first 2*rem ranks pair up; odd ones hand their data to the even one
  // below and get the result back at the end.
  int newrank;
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
    RequestId q = transport_->PostRecv(r + 1, *whole_scratch.region, whole_scratch.offset, bytes,
                                       MakeTag(seq, 0, 0));
    transport_->Wait(q, deadline);
    Reduce(data, data, scratch, count, type, op);
    newrank = r / 2;
  } else {
    newrank = r - rem;
  }
  auto real = [&](int nr) { return nr < rem ? nr * 2 : nr + rem; };
  if (p2 > 1 && bytes <= kRecursiveDoublingBytes) {
    // Recursive doubling: swap whole vectors; operands in rank order so both sides agree.
    uint32_t level = 1;
    for (int mask = 1; mask < p2; mask <<= 1, ++level) {
      int partner_new = newrank ^ mask;
      Exchange(real(partner_new), user, whole_scratch, MakeTag(seq, level, 0), deadline);
      if (newrank < partner_new) {
        Reduce(data, data, scratch, count, type, op);
      } else {
        Reduce(data, scratch, data, count, type, op);
      }
    }
    Finalize(data, count, type, op, n);
  } else if (p2 > 1) {
    // Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling.
    size_t lo = 0, hi = count;
    std::vector<std::pair<size_t, size_t>> stack;
    uint32_t level = 1;
    for (int mask = p2 / 2; mask >= 1; mask >>= 1, ++level) {
      int partner_new = newrank ^ mask;
      size_t mid = lo + (hi - lo) / 2;
      bool keep_lower = newrank < partner_new;
      size_t klo = keep_lower ? lo : mid, khi = keep_lower ? mid : hi;
      size_t slo = keep_lower ? mid : lo, shi = keep_lower ? hi : mid;
      Exchange(real(partner_new), uspan(slo, shi - slo), ScratchSpan(scratch, (khi - klo) * esize),
               MakeTag(seq, level, 0), deadline);
      Reduce(data + klo * esize, data + klo * esize, scratch, khi - klo, type, op);
      stack.emplace_back(lo, hi);
      lo = klo;
      hi = khi;
    }
    Finalize(data + lo * esize, hi - lo, type, op, n);
    level = 100;
    for (int mask = 1; mask < p2; mask <<= 1, ++level) {
      auto [plo, phi] = stack.back();
      stack.pop_back();
      int partner_new = newrank ^ mask;
      size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;
      Exchange(real(partner_new), uspan(lo, hi - lo), uspan(olo, ohi - olo), MakeTag(seq, level, 0),
               deadline);
      lo = plo;
      hi = phi;
    }
  } else {
    Finalize(data, count, type, op, n);  // n == 1 + 1 extra rank: the pair's sum is final
  }
  if (r < 2 * rem) {
    RequestId s =
        transport_->PostSend(r + 1, *user.region, user.offset, bytes, MakeTag(seq, 200, 0));
    transport_->Wait(s, deadline);
  }
}

}  // namespace cortado::dist::internal
