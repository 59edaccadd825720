// The transport: point-to-point messaging between the ranks of one job, shaped like RDMA verbs
// so that an ibverbs transport fits without changing the collectives:
//   - memory is registered before use (Register returns a MemoryRegion; TCP keeps a pointer,
//     verbs would pin it and hold lkey/rkey),
//   - sends and receives are posted (PostSend/PostRecv return a RequestId at once) and complete
//     later; the caller learns it with Test or Wait (verbs: a completion queue poll),
//   - messages carry a 64-bit tag; a receive matches the first message with its tag from that
//     peer, so posting order need not follow arrival order,
//   - connection setup is symmetric: every rank publishes LocalAddress() through the store and
//     calls Connect with everyone's address (verbs would exchange queue-pair numbers the same way).
// A posted buffer must stay valid and untouched until its request completes; every request must
// be waited or tested to completion.
//
// Threads: one thread drives a transport at a time (the communicator's). Wait and Test make
// progress on the calling thread; between operations a progress thread of the transport keeps
// posted sends moving, answers status queries and notices dead peers (UCX's keeps only its TCP
// control mesh so: its data moves when the caller waits; see ucx_transport.h).
//
// Failures: a peer that closes without saying goodbye, resets the connection, or aborts makes
// every later Wait/Test throw kPeerFailure naming the root-cause rank (an aborting peer says
// which rank it blames), on every rank, since every rank holds a connection to every other.
//
// Memory shared within a host (optional; UCX over shared memory has it, TCP does not). Memory
// the transport Allocates is registered at allocation; where SharesMemory() is true, every
// rank can map every other rank's allocated regions into its own address space (ExportRegion
// on the owner, MapPeerRegion on the peer) and load and store there directly, as one-sided RDMA
// reads and writes would across hosts. Who may touch which bytes when is the collective's
// business: the transport only maps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cortado/dist/deadline.h"
#include "cortado/dist/env.h"

namespace cortado::dist {

// Memory the transport may read from or write into.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  MemoryRegion(void* data, size_t size) : data_(data), size_(size) {}

 private:
  void* data_;
  size_t size_;
};

using RequestId = uint64_t;

// A peer's region, mapped into this process by Transport::MapPeerRegion: data() is the address
// here of the region's first byte. Unmapped when destroyed; the peer's memory stays valid while
// it is mapped, even if the peer frees it meanwhile.
class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  char* data() const { return data_; }

 protected:
  explicit PeerMemory(char* data) : data_(data) {}

 private:
  char* data_;
};

// What a peer reported when asked where it is (see Transport::QueryStatus).
struct PeerStatus {
  int rank = -1;
  bool responded = false;
  uint64_t ops_started = 0;   // operations this rank has entered
  uint64_t ops_finished = 0;  // operations it has completed
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // This process's rank and the job's world size, fixed when the transport is made.
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Opaque bytes a peer needs to connect to this rank; publish them through the store.
  virtual std::string LocalAddress() const = 0;
  // Connects to every other rank (addresses[r] from rank r's LocalAddress()). Each connection
  // starts with a handshake that checks the job identity; strangers are rejected and ignored.
  virtual void Connect(const std::vector<std::string>& addresses, Deadline deadline) = 0;

  virtual std::unique_ptr<MemoryRegion> Register(void* data, size_t bytes) = 0;
  // Allocates bytes (page-aligned, uninitialized) and registers them in one go; the region owns the
  // memory and frees it when destroyed (it may outlive the transport). The default allocates
  // host memory and calls Register; UCX allocates memory its shared-memory peers can map.
  virtual std::unique_ptr<MemoryRegion> Allocate(size_t bytes);

  // True when every rank can map the regions every other rank Allocates (decided during
  // Connect and the same on every rank): all ranks on one host, over shared memory.
  virtual bool SharesMemory() const { return false; }
  // What a peer passes to MapPeerRegion to map `region` (one this transport Allocated); empty
  // when this region cannot be mapped (e.g. its memory did not come from shared memory).
  virtual std::string ExportRegion(const MemoryRegion& region) { return {}; }
  // Maps the region peer exported (its address in the peer's process: remote_data, its size:
  // bytes). Throws kSystem naming the peer when it cannot.
  virtual std::unique_ptr<PeerMemory> MapPeerRegion(int peer, const std::string& exported,
                                                    uint64_t remote_data, size_t bytes);

  // Sends bytes [offset, offset + bytes) of region to peer, tagged.
  virtual RequestId PostSend(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                             uint64_t tag) = 0;
  // Receives the next message with this tag from peer into [offset, offset + bytes) of region;
  // the message must be exactly that long.
  virtual RequestId PostRecv(int peer, const MemoryRegion& region, size_t offset, size_t bytes,
                             uint64_t tag) = 0;
  // Drives progress once; true (and the request is retired) when it has completed.
  virtual bool Test(RequestId id) = 0;
  // Drives progress until the request completes. Throws kPeerFailure, or kTimeout at the
  // deadline (peer_rank() is the peer the request waits on).
  virtual void Wait(RequestId id, Deadline deadline) = 0;

  // Brackets an operation: the calling thread will drive progress until EndOperation, so the
  // progress thread stays out of the way; seq is reported to peers that ask (QueryStatus).
  virtual void BeginOperation(uint64_t seq) = 0;
  virtual void EndOperation(uint64_t seq) = 0;

  // Asks every connected peer how far it has got; waits for the answers until the deadline.
  virtual std::vector<PeerStatus> QueryStatus(Deadline deadline) = 0;

  // Tells every peer this rank is giving up and why (blaming root_rank, or -1), then breaks
  // the transport: later calls throw. Best effort, bounded in time.
  virtual void Abort(int root_rank, const std::string& reason) = 0;
  // Rethrows the first peer failure seen, if any (without driving progress).
  virtual void CheckHealthy() = 0;

  // How many times Wait has put its caller to sleep in the kernel until the network had
  // something for it (each such sleep ends in a wake-up), since the transport was created; any
  // thread. A diagnostic of how a wait costs: a slow link should cost a few wake-ups per chunk,
  // not one per packet, and no polling.
  virtual uint64_t WaitSleeps() const { return 0; }

 protected:
  Transport(int rank, int size) : rank_(rank), size_(size) {}

 private:
  const int rank_;
  const int size_;
};

}  // namespace cortado::dist
