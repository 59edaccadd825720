// TransportCommunicator::TreeBroadcast: a binomial tree from the root, whole messages.
#include <vector>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

void TransportCommunicator::TreeBroadcast(char* data, size_t count, DataType type, int root,
                                          uint64_t seq, Deadline deadline) {
  const int n = size_;
  const int v = Mod(rank_ - root, n);
  Span user = Reg(data, count * DataTypeSize(type));
  uint64_t tag = MakeTag(seq, 0, 0);
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      RequestId q =
          transport_->PostRecv(Mod(v - mask + root, n), *user.region, user.offset, user.bytes, tag);
      transport_->Wait(q, deadline);
      break;
    }
    mask <<= 1;
  }
  std::vector<RequestId> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      sends.push_back(transport_->PostSend(Mod(v + mask + root, n), *user.region, user.offset,
                                           user.bytes, tag));
    }
  }
  for (RequestId s : sends) transport_->Wait(s, deadline);
}

}  // namespace cortado::dist::internal
