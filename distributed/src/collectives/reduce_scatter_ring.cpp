// TransportCommunicator::DoReduceScatter: the ring reduce-scatter, partial sums alternating
// between two work buffers (the output is one of them when it does not overlap the input).
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

void TransportCommunicator::DoReduceScatter(const void* input, void* output, size_t count,
                                            DataType type, ReduceOp op) {
  const size_t esize = DataTypeSize(type);
  const size_t bytes = count * esize;
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (size_ == 1) {
    if (bytes && in != out) std::memmove(out, in, bytes);
    return;
  }
  if (count == 0) {
    RunOp(
        "reducescatter", [] { return std::string("ring, 0 elements"); }, [](uint64_t, Deadline) {});
    return;
  }
  const int n = size_, r = rank_;
  RunOp(
      "reducescatter",
      [&] {
        return StrCat("ring, ", count, " x ", DataTypeName(type), " per rank, ", ReduceOpName(op));
      },
      [&](uint64_t seq, Deadline deadline) {
        const size_t chunk = ChunkElems(count, esize);
        const int nchunks = static_cast<int>((count + chunk - 1) / chunk);
        const int window = RecvWindow();
        const size_t slots_bytes = static_cast<size_t>(window) * chunk * esize;
        bool overlap = in < out + bytes && out < in + bytes * static_cast<size_t>(n);
        // Partial results alternate between two work buffers; the output is one of them
        // (the one the last step writes) unless it overlaps the input.
        char* scratch = Scratch(slots_bytes + 2 * bytes);
        char* work[2] = {scratch + slots_bytes, scratch + slots_bytes + bytes};
        if (!overlap) work[(n - 2) % 2] = out;
        Span input_span = Reg(in, bytes * static_cast<size_t>(n));
        Span out_span = Reg(out, bytes);
        auto wspan = [&](char* base, size_t lo, size_t len) -> Span {
          if (base == out) return Span{out_span.region, out_span.offset + lo * esize, len * esize};
          return ScratchSpan(base + lo * esize, len * esize);
        };
        auto range = [&](int c, size_t* lo, size_t* len) {
          *lo = static_cast<size_t>(c) * chunk;
          *len = std::min(chunk, count - *lo);
        };
        RingPipeline(
            seq, deadline, n - 1, nchunks, Mod(r + 1, n), Mod(r - 1, n),
            [&](int t, int c) {
              size_t lo, len;
              range(c, &lo, &len);
              if (t == 0) {
                size_t x = static_cast<size_t>(Mod(r - 1, n));
                return Span{input_span.region, input_span.offset + (x * count + lo) * esize,
                            len * esize};
              }
              return wspan(work[(t - 1) % 2], lo, len);
            },
            [&](int, int c, int slot) {
              size_t lo, len;
              range(c, &lo, &len);
              return ScratchSpan(scratch + static_cast<size_t>(slot) * chunk * esize, len * esize);
            },
            [&](int t, int c, int slot, auto&& wait_send) {
              size_t lo, len;
              range(c, &lo, &len);
              // work[t % 2] chunk c was last sent at step t - 1: it must be out first.
              if (t >= 1) wait_send(t - 1, c);
              char* dst = (t == n - 2 ? out : work[t % 2]) + lo * esize;
              size_t x = static_cast<size_t>(Mod(r - t - 2, n));
              Reduce(dst, in + (x * count + lo) * esize,
                     scratch + static_cast<size_t>(slot) * chunk * esize, len, type, op);
              if (t == n - 2) Finalize(dst, len, type, op, n);
            });
      });
}

}  // namespace cortado::dist::internal
