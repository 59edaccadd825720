// TransportCommunicator::DirectAllReduce: the all-reduce of ranks that share memory (one host,
// UCX over shared memory) on buffers from AllocateRegistered. No message carries data:
//   1. every rank sends every other a descriptor of its buffer (which region, where in it, and
//      the key to map the region), which also says it has entered the operation, so its
//      buffer holds its input;
//   2. rank x reduces segment x (the ring's segments) by loading it from every rank's buffer,
//      a cache-sized block at a time, and stores the result into every rank's buffer; the
//      segments are disjoint, so no two ranks touch the same bytes;
//   3. every rank tells every other it is done, and returns once all have: by then no peer
//      reads or writes its buffer any more.
// Per rank that is one pass over the whole buffer's worth of loads and one of stores, with no
// copy into a staging buffer and no protocol per chunk (the ring over shared memory moves every
// byte twice: a copy across processes, then the reduction or the copy into place).
//
// The sums are the ring's, in the ring's order: segment x starts at rank x and each later rank
// adds its value to the running sum (Reduce(mine, received)), x+1, ..., x+n-1, and the average
// divides once at the end. So the result is bitwise what the ring would give, on every rank,
// whichever transport a job runs over.
//
// When some rank's buffer is not in memory the peers can map (it was not allocated with
// AllocateRegistered, or its region would not export), every rank learns it from the
// descriptors and they all run the ring instead.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {
namespace {

constexpr uint64_t kDescriptorMagic = 0x4344415201000000ull;  // "CDAR", version 1
// Ring steps stay far below these, so a ring run as the fallback never matches them.
constexpr uint32_t kDescriptorStep = 0xff00;
constexpr uint32_t kDoneStep = 0xff01;
// Elements of a block reduced at a time: the running sum stays in L1/L2 while each rank's slice
// of the block streams past it.
constexpr size_t kBlockBytes = 32 << 10;
// Mappings of peers' regions kept per peer.
constexpr size_t kMappingsPerPeer = 8;

// Orders this process's loads and stores of the shared buffers against the messages that
// bracket them. GCC refuses atomic_thread_fence under ThreadSanitizer, whose builds never run
// this algorithm (see UcxTransport::Allocate); the compiler barrier keeps them building.
inline void SharedMemoryFence() {
#if defined(CORTADO_TSAN)
  std::atomic_signal_fence(std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

struct Descriptor {
  uint64_t magic;
  uint64_t uid;          // the region's uid in its owner's process; 0: not mappable
  uint64_t region_data;  // the region's address in its owner's process
  uint64_t region_bytes;
  uint64_t offset;  // the buffer's byte offset in the region
  uint64_t bytes;   // count x element size
  uint32_t type;
  uint32_t op;
  uint32_t exported_bytes;
  uint32_t reserved;
  char exported[192];  // the transport's export of the region (a UCX remote key)
};
static_assert(sizeof(Descriptor) == 256, "descriptors travel as fixed 256-byte messages");

// This rank's descriptor of its buffer [data, data + bytes): mappable when it lies in an
// allocated region (`region`, null when not) that the transport exported (`exported`).
Descriptor Describe(const char* data, size_t bytes, DataType type, ReduceOp op,
                    const AllocatedRegion* region, const std::string& exported) {
  Descriptor d;
  std::memset(&d, 0, sizeof(d));
  d.magic = kDescriptorMagic;
  d.bytes = bytes;
  d.type = static_cast<uint32_t>(type);
  d.op = static_cast<uint32_t>(op);
  if (region != nullptr && !exported.empty() && exported.size() <= sizeof(d.exported)) {
    d.uid = region->uid;
    d.region_data = reinterpret_cast<uint64_t>(region->data);
    d.region_bytes = region->bytes;
    d.offset = static_cast<uint64_t>(data - region->data);
    d.exported_bytes = static_cast<uint32_t>(exported.size());
    std::memcpy(d.exported, exported.data(), exported.size());
  }
  return d;
}

// Checks every rank's descriptor against this rank's (`mine`), the same way on every rank, so
// all reach the same verdict: the first rank whose buffer cannot be mapped, or -1. Throws
// kProtocol naming a rank that entered another operation or sent a malformed descriptor.
int FirstUnmappable(const Descriptor* desc, int n, const Descriptor& mine) {
  int unmappable = -1;
  for (int p = 0; p < n; ++p) {
    const Descriptor& d = desc[p];
    if (d.magic != kDescriptorMagic || d.bytes != mine.bytes || d.type != mine.type ||
        d.op != mine.op) {
      throw Error(
          ErrorKind::kProtocol,
          StrCat("rank ", p, " entered a different operation (", d.bytes, " bytes, type ", d.type,
                 ", op ", d.op, " where this rank has ", mine.bytes, " bytes, type ", mine.type,
                 ", op ", mine.op, "; mismatched collective calls?)"),
          p);
    }
    if (d.uid != 0 && (d.exported_bytes > sizeof(d.exported) || d.offset > d.region_bytes ||
                       d.bytes > d.region_bytes - d.offset)) {
      throw Error(ErrorKind::kProtocol,
                  StrCat("rank ", p, " sent a malformed direct all-reduce descriptor"), p);
    }
    if (d.uid == 0 && unmappable < 0) unmappable = p;
  }
  return unmappable;
}

// Reduces segment r of the ring's segments from every rank's buffer (buf[p]), `block` elements
// at a time into `acc`, in the ring's order, and stores the result into every buffer.
void ReduceSegment(const std::vector<char*>& buf, int r, size_t count, DataType type, ReduceOp op,
                   size_t block, char* acc) {
  const int n = static_cast<int>(buf.size());
  const size_t esize = DataTypeSize(type);
  Segments seg{count, n};
  const size_t lo = seg.Offset(r), len = seg.Size(r);
  for (size_t b = 0; b < len; b += block) {
    const size_t m = std::min(block, len - b);
    const size_t at = (lo + b) * esize;
    auto src = [&](int k) { return buf[static_cast<size_t>(Mod(r + k, n))] + at; };
    Reduce(acc, src(1), src(0), m, type, op);
    for (int k = 2; k < n; ++k) Reduce(acc, src(k), acc, m, type, op);
    Finalize(acc, m, type, op, n);
    for (int p = 0; p < n; ++p) std::memcpy(buf[static_cast<size_t>(p)] + at, acc, m * esize);
  }
}

}  // namespace

char* TransportCommunicator::MappedPeerRegion(int peer, uint64_t uid, const std::string& exported,
                                              uint64_t remote_data, size_t bytes) {
  for (auto& m : peer_mappings_) {
    if (m.peer == peer && m.uid == uid) {
      m.used = ++mapping_clock_;
      return m.memory->data();
    }
  }
  size_t of_peer = 0;
  auto oldest = peer_mappings_.end();
  for (auto it = peer_mappings_.begin(); it != peer_mappings_.end(); ++it) {
    if (it->peer != peer) continue;
    ++of_peer;
    if (oldest == peer_mappings_.end() || it->used < oldest->used) oldest = it;
  }
  if (of_peer >= kMappingsPerPeer) peer_mappings_.erase(oldest);
  auto memory = transport_->MapPeerRegion(peer, exported, remote_data, bytes);
  char* data = memory->data();
  peer_mappings_.push_back(PeerMapping{peer, uid, std::move(memory), ++mapping_clock_});
  return data;
}

bool TransportCommunicator::DirectAllReduce(char* data, size_t count, DataType type, ReduceOp op,
                                            bool forced, uint64_t seq, Deadline deadline) {
  const int n = size_, r = rank_;
  const size_t esize = DataTypeSize(type);
  const size_t bytes = count * esize;
  const size_t block = std::max<size_t>(1, kBlockBytes / esize);
  // Scratch: n descriptors (registered, they travel), then the running sum of one block.
  const size_t desc_bytes = static_cast<size_t>(n) * sizeof(Descriptor);
  char* scratch = Scratch(desc_bytes + block * esize);
  auto* desc = reinterpret_cast<Descriptor*>(scratch);

  // 1. Descriptors, all to all (sending one says this rank's input is in place).
  AllocatedRegion region;
  const bool allocated = FindAllocated(data, bytes, &region);
  desc[r] = Describe(data, bytes, type, op, allocated ? &region : nullptr,
                     allocated ? transport_->ExportRegion(*region.region) : std::string());
  FencedAllToAll(MakeTag(seq, kDescriptorStep, 0), sizeof(Descriptor), deadline);
  if (const int unmappable = FirstUnmappable(desc, n, desc[r]); unmappable >= 0) {
    if (!forced) return false;
    throw Error(ErrorKind::kInvalidArgument,
                StrCat("algorithm 'direct': rank ", unmappable,
                       "'s buffer is not in memory its peers can map (allocate it with "
                       "Communicator::AllocateRegistered)"),
                unmappable);
  }

  // 2. Reduce this rank's segment from every rank's buffer, in the ring's order.
  std::vector<char*> buf(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    const Descriptor& d = desc[p];
    buf[static_cast<size_t>(p)] =
        p == r ? data
               : MappedPeerRegion(p, d.uid, std::string(d.exported, d.exported_bytes),
                                  d.region_data, d.region_bytes) +
                     d.offset;
  }
  ReduceSegment(buf, r, count, type, op, block, scratch + desc_bytes);

  // 3. Done, all to all: once every peer's message is here, nobody touches this buffer.
  FencedAllToAll(MakeTag(seq, kDoneStep, 0), 0, deadline);
  return true;
}

// Rank p's message lands in slot p of the scratch (slot bytes each), this rank's is sent from
// slot rank_. The fences order this process's loads and stores of the shared buffers: what it
// stored before is visible to a peer that has its message, and what a peer stored before its
// message is visible here after.
void TransportCommunicator::FencedAllToAll(uint64_t tag, size_t slot, Deadline deadline) {
  SharedMemoryFence();
  std::vector<RequestId> ids;
  ids.reserve(2 * static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    ids.push_back(
        transport_->PostRecv(p, *scratch_region_, static_cast<size_t>(p) * slot, slot, tag));
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    ids.push_back(
        transport_->PostSend(p, *scratch_region_, static_cast<size_t>(rank_) * slot, slot, tag));
  }
  for (RequestId id : ids) transport_->Wait(id, deadline);
  SharedMemoryFence();
}

}  // namespace cortado::dist::internal
