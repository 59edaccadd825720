// TransportCommunicator::ChainBroadcast: a pipelined chain from the root, chunk by chunk.
#include <algorithm>
#include <vector>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

void TransportCommunicator::ChainBroadcast(char* data, size_t count, DataType type, int root,
                                           uint64_t seq, Deadline deadline) {
  const int n = size_;
  const int v = Mod(rank_ - root, n);
  const size_t esize = DataTypeSize(type);
  const size_t chunk = ChunkElems(count, esize);
  const int nchunks = static_cast<int>((count + chunk - 1) / chunk);
  Span user = Reg(data, count * esize);
  auto span = [&](int c) {
    size_t lo = static_cast<size_t>(c) * chunk;
    return Span{user.region, user.offset + lo * esize, std::min(chunk, count - lo) * esize};
  };
  const int next = Mod(rank_ + 1, n), prev = Mod(rank_ - 1, n);
  std::vector<RequestId> sends;
  if (v == 0) {
    for (int c = 0; c < nchunks; ++c) {
      Span s = span(c);
      sends.push_back(transport_->PostSend(next, *s.region, s.offset, s.bytes, MakeTag(seq, 0, c)));
    }
  } else {
    const int window = RecvWindow();
    std::vector<RequestId> recvs(static_cast<size_t>(nchunks));
    auto post = [&](int c) {
      Span s = span(c);
      recvs[static_cast<size_t>(c)] =
          transport_->PostRecv(prev, *s.region, s.offset, s.bytes, MakeTag(seq, 0, c));
    };
    for (int c = 0; c < std::min(window, nchunks); ++c) post(c);
    for (int c = 0; c < nchunks; ++c) {
      transport_->Wait(recvs[static_cast<size_t>(c)], deadline);
      if (c + window < nchunks) post(c + window);
      if (v != n - 1) {
        Span s = span(c);
        sends.push_back(
            transport_->PostSend(next, *s.region, s.offset, s.bytes, MakeTag(seq, 0, c)));
      }
    }
  }
  for (RequestId s : sends) transport_->Wait(s, deadline);
}

}  // namespace cortado::dist::internal
