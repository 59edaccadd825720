// TransportCommunicator::RingAllGather: the ring all-gather (also Split's exchange), a pipeline
// of chunks received straight into the output.
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

void TransportCommunicator::RingAllGather(const char* name, const void* input, void* output,
                                          size_t count, DataType type) {
  const size_t esize = DataTypeSize(type);
  const size_t bytes = count * esize;
  char* out = static_cast<char*>(output);
  const char* in = static_cast<const char*>(input);
  char* mine = out + static_cast<size_t>(rank_) * bytes;
  if (in != mine && bytes > 0) {
    bool overlap = in < out + bytes * static_cast<size_t>(size_) && out < in + bytes;
    if (overlap) {
      throw Error(ErrorKind::kInvalidArgument,
                  StrCat(name, ": input overlaps output other than at output + rank * count"), -1,
                  name);
    }
    std::memcpy(mine, in, bytes);
  }
  if (size_ == 1) return;
  if (count == 0) {
    RunOp(
        name, [] { return std::string("ring, 0 elements"); }, [](uint64_t, Deadline) {});
    return;
  }
  const int n = size_, r = rank_;
  RunOp(
      name, [&] { return StrCat("ring, ", count, " x ", DataTypeName(type), " per rank"); },
      [&](uint64_t seq, Deadline deadline) {
        const size_t chunk = ChunkElems(count, esize);
        const int nchunks = static_cast<int>((count + chunk - 1) / chunk);
        Span user = Reg(out, bytes * static_cast<size_t>(n));
        auto span = [&](int x, int c) {
          size_t lo = static_cast<size_t>(c) * chunk;
          return Span{user.region, user.offset + static_cast<size_t>(x) * bytes + lo * esize,
                      std::min(chunk, count - lo) * esize};
        };
        RingPipeline(
            seq, deadline, n - 1, nchunks, Mod(r + 1, n), Mod(r - 1, n),
            [&](int t, int c) { return span(Mod(r - t, n), c); },
            [&](int t, int c, int) { return span(Mod(r - t - 1, n), c); },
            [](int, int, int, auto&&) {});
      });
}

}  // namespace cortado::dist::internal
