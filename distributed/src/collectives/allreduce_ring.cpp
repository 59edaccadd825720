// TransportCommunicator::RingAllReduce: reduce-scatter then all-gather around the ring, each a
// pipeline of chunks (RingPipeline); the all-gather half receives straight into place.
#include <algorithm>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

void TransportCommunicator::RingAllReduce(char* data, size_t count, DataType type, ReduceOp op,
                                          uint64_t seq, Deadline deadline) {
  const int n = size_, r = rank_;
  const size_t esize = DataTypeSize(type);
  Segments seg{count, n};
  const size_t max_seg = seg.Size(0);
  const size_t chunk = ChunkElems(max_seg, esize);
  const int nchunks = static_cast<int>(std::max<size_t>(1, (max_seg + chunk - 1) / chunk));
  const int window = RecvWindow();
  char* scratch = Scratch(static_cast<size_t>(window) * chunk * esize);
  Span user = Reg(data, count * esize);
  // Elements [lo, hi) of segment x's chunk c.
  auto range = [&](int x, int c, size_t* lo, size_t* len) {
    size_t sz = seg.Size(x);
    size_t a = std::min(static_cast<size_t>(c) * chunk, sz);
    *lo = seg.Offset(x) + a;
    *len = std::min(chunk, sz - a);
  };
  auto send_seg = [&](int t) { return t < n - 1 ? Mod(r - t, n) : Mod(r + 1 - (t - (n - 1)), n); };
  auto recv_seg = [&](int t) { return t < n - 1 ? Mod(r - t - 1, n) : Mod(r - (t - (n - 1)), n); };
  auto user_span = [&](int x, int c) {
    size_t lo, len;
    range(x, c, &lo, &len);
    return Span{user.region, user.offset + lo * esize, len * esize};
  };
  RingPipeline(
      seq, deadline, 2 * (n - 1), nchunks, Mod(r + 1, n), Mod(r - 1, n),
      [&](int t, int c) { return user_span(send_seg(t), c); },
      [&](int t, int c, int slot) {
        if (t >= n - 1) return user_span(recv_seg(t), c);  // all-gather: straight into place
        size_t lo, len;
        range(recv_seg(t), c, &lo, &len);
        return ScratchSpan(scratch + static_cast<size_t>(slot) * chunk * esize, len * esize);
      },
      [&](int t, int c, int slot, auto&&) {
        if (t >= n - 1) return;
        size_t lo, len;
        range(recv_seg(t), c, &lo, &len);
        char* mine = data + lo * esize;
        Reduce(mine, mine, scratch + static_cast<size_t>(slot) * chunk * esize, len, type, op);
        if (t == n - 2) Finalize(mine, len, type, op, n);  // this rank owns the final value
      });
}

}  // namespace cortado::dist::internal
