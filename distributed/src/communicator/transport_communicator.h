// Internal: TransportCommunicator, the collectives over a Transport (TCP or UCX), and the helpers
// its algorithms share. Setup, operation bookkeeping and the dispatchers that choose an algorithm
// are in transport_communicator.cpp; each algorithm is a member function in a file of its own
// under collectives/ (allreduce_ring.cpp, broadcast_tree.cpp, ...). The ring-shaped ones share
// one pipelining engine, RingPipeline.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "communicator/backends.h"
#include "communicator/failure.h"
#include "cortado/dist/transport.h"

namespace cortado::dist::internal {

inline uint64_t MakeTag(uint64_t seq, uint32_t step, uint32_t chunk) {
  return ((seq & 0xffffffull) << 40) | (static_cast<uint64_t>(step & 0xffffu) << 24) |
         (chunk & 0xffffffu);
}

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

struct Span {
  const MemoryRegion* region = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
};

// Pipelining. A ring collective is a chain of steps; step t+1 sends what step t received (after
// reducing it). Every segment is cut into chunks, and chunk-steps (t, c) flow in a fixed order
// that every rank follows for its sends and therefore, by symmetry, for its receives: first
// `lead` chunks of step 0, then after each chunk received and reduced, that chunk's next step
// followed by one more step-0 chunk. The socket thus always has data to send, reduced data is
// forwarded while still in cache, and the reduction reads the received chunk from a small
// scratch slot (L2-resident) while the next chunks are in flight. The all-gather half receives
// straight into the user's buffer; nothing is copied in user space except the reduction itself.
// RingSchedule is that order; RingPipeline (below) runs it.
struct RingSchedule {
  std::vector<std::pair<int, int>> order;  // (step, chunk)
  std::vector<size_t> ready_after;         // sends postable once entry i has been received
  size_t initial = 0;                      // sends postable at once
};

inline RingSchedule MakeRingSchedule(int steps, int nchunks, int lead) {
  RingSchedule s;
  s.order.reserve(static_cast<size_t>(steps) * static_cast<size_t>(nchunks));
  int released = std::min(lead, nchunks);
  for (int c = 0; c < released; ++c) s.order.emplace_back(0, c);
  s.initial = s.order.size();
  for (size_t i = 0; i < s.order.size(); ++i) {
    auto [t, c] = s.order[i];
    if (t + 1 < steps) s.order.emplace_back(t + 1, c);
    if (t == 0 && released < nchunks) s.order.emplace_back(0, released++);
    s.ready_after.push_back(s.order.size());
  }
  return s;
}

// Element ranges of n near-equal segments of count elements.
struct Segments {
  size_t count;
  int n;
  size_t Size(int x) const { return count / n + (static_cast<size_t>(x) < count % n ? 1 : 0); }
  size_t Offset(int x) const {
    return static_cast<size_t>(x) * (count / n) + std::min<size_t>(x, count % n);
  }
};

inline int Mod(int a, int n) { return ((a % n) + n) % n; }

// How the descendants of a communicator (Split) reach the job's rendezvous store when the caller
// gave none: the process that serves the root communicator's TcpStoreServer shares it, the
// others connect a TcpStore client to master_addr:master_port with the root's identity (the
// server admits clients by the root's world size and their rank in the root).
struct StoreAccess {
  std::shared_ptr<TcpStoreServer> server;
  JobIdentity identity;
  int rank = 0;
};

// The regions AllocateRegistered handed out and that are still alive: Reg finds buffers in them
// without registering anything, and the direct all-reduce names them to the peers by uid. Shared
// with the RegisteredMemory objects, which may outlive the communicator and remove themselves
// from it (on whichever thread frees them; hence the mutex).
struct AllocatedRegion {
  const char* data = nullptr;
  size_t bytes = 0;
  uint64_t uid = 0;  // unique in this process, never 0
  const MemoryRegion* region = nullptr;
};
struct AllocationTable {
  std::mutex mu;
  std::vector<AllocatedRegion> regions;
};

class TransportCommunicator final : public Communicator {
 public:
  // A root communicator (rendezvous == nullptr) rendezvouses as CommConfig says; a child of
  // Split passes the store to rendezvous through and its parent's StoreAccess.
  explicit TransportCommunicator(const CommConfig& config, Store* rendezvous = nullptr,
                                 StoreAccess access = {});
  ~TransportCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return size_ == 1 ? "local" : transport_->name(); }
  std::string AllReduceAlgorithmFor(size_t bytes, Algorithm algo, const void* data) const override;
  std::unique_ptr<RegisteredMemory> AllocateRegistered(size_t bytes) override;

 protected:
  void DoAllReduce(void* data, size_t count, DataType type, ReduceOp op, Algorithm algo) override;
  void DoBroadcast(void* data, size_t count, DataType type, int root, Algorithm algo) override;
  void DoAllGather(const void* input, void* output, size_t count, DataType type) override;
  void DoReduceScatter(const void* input, void* output, size_t count, DataType type,
                       ReduceOp op) override;
  void DoBarrier() override;
  void DoAllReduceCompressed(float* data, size_t count, ReduceOp op,
                             const Compression& compression) override;
  std::unique_ptr<Communicator> DoSplit(int color, int key) override;
  uint64_t WaitSleeps() const override { return transport_ ? transport_->WaitSleeps() : 0; }

 private:
  // The ring all-gather, run as operation `name` ("allgather", or "split" for its exchange).
  void RingAllGather(const char* name, const void* input, void* output, size_t count,
                     DataType type);
  // Runs one numbered operation; describe() (only called on failure) says what it was.
  template <typename Describe, typename Body>
  void RunOp(const char* name, Describe describe, Body body);
  [[noreturn]] void OnFailure(const char* name, const std::string& detail, uint64_t seq,
                              const Error& e);
  Span Reg(const void* p, size_t bytes);
  // The allocated region holding [p, p + bytes), if there is one.
  bool FindAllocated(const void* p, size_t bytes, AllocatedRegion* found) const;
  // Whether an all-reduce of `bytes` with `algo` tries kDirect (the ranks then agree in its
  // first exchange whether it runs), before the choice between ring and halving-doubling.
  bool TriesDirect(size_t bytes, Algorithm algo) const;
  char* Scratch(size_t bytes);
  Span ScratchSpan(const char* p, size_t bytes) const {
    return Span{scratch_region_.get(), static_cast<size_t>(p - scratch_.get()), bytes};
  }
  size_t ChunkElems(size_t seg_elems, size_t esize) const;
  // Receives posted ahead in a ring pipeline (each may own a scratch chunk): enough to cover
  // what a peer can have in flight, so chunks land in place instead of waiting in the socket.
  int RecvWindow() const { return std::max(8, 4 * options().pipeline_depth); }

  // Runs steps x nchunks chunk-steps in RingSchedule's order: chunk-step (t, c) sends
  // send_span(t, c) to `to` and receives recv_span(t, c, slot) from `from`; on_recv(t, c, slot,
  // wait_send) runs as each receive completes (wait_send(t, c) waits for that send to finish).
  template <typename SendSpan, typename RecvSpan, typename OnRecv>
  void RingPipeline(uint64_t seq, Deadline deadline, int steps, int nchunks, int to, int from,
                    SendSpan send_span, RecvSpan recv_span, OnRecv on_recv);

  void RingAllReduce(char* data, size_t count, DataType type, ReduceOp op, uint64_t seq,
                     Deadline deadline);
  void HalvingDoublingAllReduce(char* data, size_t count, DataType type, ReduceOp op, uint64_t seq,
                                Deadline deadline);
  // Halving-doubling's power-of-two core: p2 ranks, this one core rank `rank`; each of the first
  // `rem` core ranks stands for a pair of real ranks whose sum it holds.
  struct PowerOfTwoCore {
    int rank;
    int p2;
    int rem;
    int Real(int core_rank) const { return core_rank < rem ? core_rank * 2 : core_rank + rem; }
  };
  void RecursiveDoubling(char* data, size_t count, DataType type, ReduceOp op,
                         const PowerOfTwoCore& core, uint64_t seq, Deadline deadline);
  void RabenseifnerAllReduce(char* data, size_t count, DataType type, ReduceOp op,
                             const PowerOfTwoCore& core, uint64_t seq, Deadline deadline);
  // False (nothing reduced) when the ranks found some rank's buffer outside memory they can
  // map, and `forced` is false: the caller then runs the ring. Forced, that is an error.
  bool DirectAllReduce(char* data, size_t count, DataType type, ReduceOp op, bool forced,
                       uint64_t seq, Deadline deadline);
  // The direct all-reduce's exchanges: every rank sends every other one message, fenced
  // (allreduce_direct.cpp).
  void FencedAllToAll(uint64_t tag, size_t slot, Deadline deadline);
  // This process's mapping of peer's region uid (mapped from `exported` on first use).
  char* MappedPeerRegion(int peer, uint64_t uid, const std::string& exported, uint64_t remote_data,
                         size_t bytes);
  void CompressedRingAllReduce(float* data, size_t count, const Compression& compression,
                               uint64_t seq, Deadline deadline);
  void ChainBroadcast(char* data, size_t count, DataType type, int root, uint64_t seq,
                      Deadline deadline);
  void TreeBroadcast(char* data, size_t count, DataType type, int root, uint64_t seq,
                     Deadline deadline);
  void Exchange(int peer, const Span& send, const Span& recv, uint64_t tag, Deadline deadline);

  int rank_;
  int size_;
  // What Split needs to build children: this communicator's config (config_.store is the
  // caller's store, or null when the job rendezvouses through the TCP store) and StoreAccess.
  CommConfig config_;
  StoreAccess access_;
  uint64_t splits_ = 0;  // Split calls so far: numbers the children's store key prefixes
  std::unique_ptr<Transport> transport_;
  uint64_t seq_ = 0;
  Breakage broken_;

  struct RegEntry {
    const char* p;
    size_t bytes;
    std::unique_ptr<MemoryRegion> region;
    uint64_t used;
  };
  std::vector<RegEntry> regs_;
  uint64_t reg_clock_ = 0;
  std::unique_ptr<char, FreeDeleter> scratch_;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<MemoryRegion> scratch_region_;
  std::shared_ptr<AllocationTable> allocations_ = std::make_shared<AllocationTable>();

  // Peers' regions mapped for the direct all-reduce, the most recently used kept (a mapping
  // holds the peer's memory even after the peer frees it, so few are kept).
  struct PeerMapping {
    int peer;
    uint64_t uid;
    std::unique_ptr<PeerMemory> memory;
    uint64_t used;
  };
  std::vector<PeerMapping> peer_mappings_;
  uint64_t mapping_clock_ = 0;
};

template <typename Describe, typename Body>
void TransportCommunicator::RunOp(const char* name, Describe describe, Body body) {
  broken_.ThrowIfBroken(name);
  uint64_t seq = ++seq_;
  Deadline deadline = Deadline::After(options().timeout);
  transport_->BeginOperation(seq);
  try {
    body(seq, deadline);
  } catch (const Error& e) {
    transport_->EndOperation(seq - 1);
    OnFailure(name, describe(), seq, e);
  } catch (const std::exception& e) {
    transport_->EndOperation(seq - 1);
    OnFailure(name, describe(), seq, Error(ErrorKind::kInternal, e.what()));
  }
  transport_->EndOperation(seq);
}

template <typename SendSpan, typename RecvSpan, typename OnRecv>
void TransportCommunicator::RingPipeline(uint64_t seq, Deadline deadline, int steps, int nchunks,
                                         int to, int from, SendSpan send_span, RecvSpan recv_span,
                                         OnRecv on_recv) {
  RingSchedule sched = MakeRingSchedule(steps, nchunks, options().pipeline_depth);
  const size_t total = sched.order.size();
  const size_t window = static_cast<size_t>(RecvWindow());
  std::vector<RequestId> recv_id(total), send_id(total);
  std::vector<size_t> pos(total);
  for (size_t j = 0; j < total; ++j) {
    pos[static_cast<size_t>(sched.order[j].first) * nchunks + sched.order[j].second] = j;
  }
  std::vector<char> send_done(total, 0);
  auto tag = [&](size_t j) {
    return MakeTag(seq, static_cast<uint32_t>(sched.order[j].first),
                   static_cast<uint32_t>(sched.order[j].second));
  };
  auto post_send = [&](size_t j) {
    Span s = send_span(sched.order[j].first, sched.order[j].second);
    send_id[j] = transport_->PostSend(to, *s.region, s.offset, s.bytes, tag(j));
  };
  auto post_recv = [&](size_t j) {
    Span s = recv_span(sched.order[j].first, sched.order[j].second, static_cast<int>(j % window));
    recv_id[j] = transport_->PostRecv(from, *s.region, s.offset, s.bytes, tag(j));
  };
  auto wait_send = [&](int t, int c) {
    size_t j = pos[static_cast<size_t>(t) * nchunks + c];
    if (!send_done[j]) {
      transport_->Wait(send_id[j], deadline);
      send_done[j] = 1;
    }
  };
  size_t next_send = 0;
  for (; next_send < sched.initial; ++next_send) post_send(next_send);
  for (size_t j = 0; j < std::min(window, total); ++j) post_recv(j);
  for (size_t i = 0; i < total; ++i) {
    transport_->Wait(recv_id[i], deadline);
    on_recv(sched.order[i].first, sched.order[i].second, static_cast<int>(i % window), wait_send);
    if (i + window < total) post_recv(i + window);
    for (; next_send < sched.ready_after[i]; ++next_send) post_send(next_send);
  }
  for (size_t j = 0; j < total; ++j) {
    if (!send_done[j]) transport_->Wait(send_id[j], deadline);
  }
}

}  // namespace cortado::dist::internal
