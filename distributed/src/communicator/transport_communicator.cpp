// TransportCommunicator's setup (rendezvous through a store, full-mesh connect), registration
// and scratch, operation numbering and failure diagnosis, the pairwise Exchange, the dispatchers
// that choose an algorithm, the barrier and Split. The algorithms are in files of their own (see
// transport_communicator.h).
#include "communicator/transport_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "bootstrap/rendezvous.h"
#include "collectives/reduce.h"
#include "cortado/dist/transport.h"

namespace cortado::dist::internal {

constexpr size_t kMinChunkBytes = 16 << 10;

TransportCommunicator::TransportCommunicator(const CommConfig& config, Store* rendezvous,
                                             StoreAccess access)
    : Communicator(config.options),
      rank_(config.rank),
      size_(config.world_size),
      config_(config),
      access_(std::move(access)) {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    Fail(ErrorKind::kInvalidArgument, "rank ", rank_, " is outside the world of ", size_);
  }
  config_.store_fd = -1;   // an inherited listening socket is adopted once, below
  if (size_ == 1) return;  // a world of one needs no rendezvous and no transport
  Deadline deadline = Deadline::After(options().EffectiveConnectTimeout());
  // Children keep the root's token and fingerprint; the handshake checks their own world size.
  JobIdentity identity{config.job_token, size_, config.fingerprint};
  Store* store = rendezvous ? rendezvous : config.store;
  std::unique_ptr<TcpStore> client;
  if (!store) {
    if (config.job_token.empty()) {
      Fail(ErrorKind::kConfig, "no job token for a ", size_,
           "-rank job: set CORTADO_JOB_TOKEN on every rank "
           "(`cortado launch` does)");
    }
    access_.identity = identity;
    access_.rank = rank_;
    if (rank_ == 0) {
      // Bind the master address itself when it is local; otherwise every interface.
      try {
        access_.server = std::make_shared<TcpStoreServer>(identity, config.master_addr,
                                                          config.master_port, config.store_fd);
      } catch (const Error& e) {
        if (config.store_fd >= 0) throw;
        access_.server = std::make_shared<TcpStoreServer>(identity, "0.0.0.0", config.master_port);
      }
      store = &access_.server->local_store();
    } else {
      client = std::make_unique<TcpStore>(config.master_addr, config.master_port, identity, rank_,
                                          deadline, options().timeout);
      store = client.get();
    }
  }
  // Hosts before the transport's address: the UCX transport decides between eager sends
  // and rendezvous from them before it creates its context (transport/ucx/eager_policy.h).
  const HostGather gather_hosts = [&](const std::string& mine) {
    return ExchangeAddresses(*store, config.store_prefix + "cortado/host/", rank_, size_, mine,
                             deadline, options().EffectiveConnectTimeout());
  };
  transport_ = CreateTransportFor(options(), identity, rank_, config.master_addr, gather_hosts);
  const std::vector<std::string> addresses =
      ExchangeAddresses(*store, config.store_prefix + "cortado/addr/", rank_, size_,
                        transport_->LocalAddress(), deadline, options().EffectiveConnectTimeout());
  transport_->Connect(addresses, deadline);
}

TransportCommunicator::~TransportCommunicator() {
  StopWorker();
  peer_mappings_.clear();  // remote keys go before the endpoints they came through
  transport_.reset();
  access_.server.reset();  // the store stops when its last communicator in this process goes
}

namespace {

// Memory a transport allocated for AllocateRegistered, listed in the communicator's table while
// it lives.
class TransportMemory final : public RegisteredMemory {
 public:
  TransportMemory(std::unique_ptr<MemoryRegion> region, std::shared_ptr<AllocationTable> table,
                  uint64_t uid)
      : RegisteredMemory(region->data(), region->size()),
        region_(std::move(region)),
        table_(std::move(table)),
        uid_(uid) {}
  ~TransportMemory() override {
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto& v = table_->regions;
      v.erase(std::remove_if(v.begin(), v.end(),
                             [&](const AllocatedRegion& a) { return a.uid == uid_; }),
              v.end());
    }
    region_.reset();
  }

 private:
  std::unique_ptr<MemoryRegion> region_;
  std::shared_ptr<AllocationTable> table_;
  uint64_t uid_;
};

}  // namespace

std::unique_ptr<RegisteredMemory> TransportCommunicator::AllocateRegistered(size_t bytes) {
  if (size_ == 1) return Communicator::AllocateRegistered(bytes);
  static std::atomic<uint64_t> next_uid{1};
  const uint64_t uid = next_uid.fetch_add(1);
  std::unique_ptr<MemoryRegion> region = transport_->Allocate(bytes);
  AllocatedRegion entry{static_cast<const char*>(region->data()), bytes, uid, region.get()};
  {
    std::lock_guard<std::mutex> lock(allocations_->mu);
    allocations_->regions.push_back(entry);
  }
  return std::make_unique<TransportMemory>(std::move(region), allocations_, uid);
}

bool TransportCommunicator::FindAllocated(const void* p, size_t bytes,
                                          AllocatedRegion* found) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(allocations_->mu);
  for (const auto& a : allocations_->regions) {
    if (c >= a.data && bytes <= a.bytes && c - a.data <= static_cast<ptrdiff_t>(a.bytes - bytes)) {
      *found = a;
      return true;
    }
  }
  return false;
}

Span TransportCommunicator::Reg(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  if (AllocatedRegion a; FindAllocated(p, bytes, &a)) {
    return Span{a.region, static_cast<size_t>(c - a.data), bytes};
  }
  for (auto& e : regs_) {
    if (c >= e.p && c + bytes <= e.p + e.bytes) {
      e.used = ++reg_clock_;
      return Span{e.region.get(), static_cast<size_t>(c - e.p), bytes};
    }
  }
  // Registration is free for TCP but pins memory for RDMA, so keep the few most recent.
  constexpr size_t kMaxRegions = 16;
  if (regs_.size() >= kMaxRegions) {
    auto oldest =
        std::min_element(regs_.begin(), regs_.end(),
                         [](const RegEntry& a, const RegEntry& b) { return a.used < b.used; });
    regs_.erase(oldest);
  }
  regs_.push_back(
      RegEntry{c, bytes, transport_->Register(const_cast<char*>(c), bytes), ++reg_clock_});
  return Span{regs_.back().region.get(), 0, bytes};
}

char* TransportCommunicator::Scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    size_t grown = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
    grown = (grown + 4095) / 4096 * 4096;
    scratch_region_.reset();
    scratch_.reset(static_cast<char*>(std::aligned_alloc(4096, grown)));
    if (!scratch_) Fail(ErrorKind::kSystem, "out of memory for ", grown, " bytes of scratch");
    scratch_bytes_ = grown;
    scratch_region_ = transport_->Register(scratch_.get(), grown);
  }
  return scratch_.get();
}

size_t TransportCommunicator::ChunkElems(size_t seg_elems, size_t esize) const {
  size_t max_e = std::max<size_t>(1, options().chunk_bytes / esize);
  size_t min_e = std::max<size_t>(1, kMinChunkBytes / esize);
  // Aim for at least four chunks per segment so medium messages pipeline too.
  size_t e = std::clamp(seg_elems / 4, min_e, std::max(min_e, max_e));
  e = (e + 15) / 16 * 16;  // whole cache lines for the vector loops
  // Keep the chunk index within the 24 bits of the tag.
  while (seg_elems / e >= (1u << 24) - 1) e *= 2;
  return e;
}

void TransportCommunicator::OnFailure(const char* name, const std::string& detail, uint64_t seq,
                                      const Error& e) {
  const std::string prefix = StrCat(name, " #", seq, " (", detail, ")");
  std::string message;
  int root = e.peer_rank();
  LateRanks late;
  if (e.kind() == ErrorKind::kTimeout) {
    // Find out who never got here: ask every peer how far it is (bounded to one second).
    late = FindLateRanks(transport_->QueryStatus(Deadline::After(std::chrono::seconds(1))), rank_,
                         seq, "did not answer");
    const double secs = std::chrono::duration<double>(options().timeout).count();
    if (!late.ranks.empty()) {
      message = LateRanksMessage(prefix, secs, late);
      root = late.ranks.front();
    } else {
      message =
          StrCat(prefix, ": deadline of ", secs, " s (CORTADO_TIMEOUT_S) passed waiting for rank ",
                 e.peer_rank(), "; every rank had arrived (a stuck or very slow link?)");
    }
  } else {
    message = StrCat(prefix, ": ", e.what());
  }
  broken_.Set(message, root);
  try {
    transport_->Abort(root, message);
  } catch (const std::exception&) {
  }
  const ErrorKind kind =
      e.kind() == ErrorKind::kTimeout ? ErrorKind::kTimeout : ErrorKind::kPeerFailure;
  throw Error(kind, message, root, name, late.ranks);
}

void TransportCommunicator::Exchange(int peer, const Span& send, const Span& recv, uint64_t tag,
                                     Deadline deadline) {
  RequestId r = transport_->PostRecv(peer, *recv.region, recv.offset, recv.bytes, tag);
  RequestId s = transport_->PostSend(peer, *send.region, send.offset, send.bytes, tag);
  transport_->Wait(r, deadline);
  transport_->Wait(s, deadline);
}

// ----------------------------------------------------------------------------------------------
// All-reduce

bool TransportCommunicator::TriesDirect(size_t bytes, Algorithm algo) const {
  if (size_ == 1 || !transport_->SharesMemory()) return false;
  const Algorithm requested = algo == Algorithm::kAuto ? options().allreduce_algorithm : algo;
  if (requested == Algorithm::kDirect) return true;
  // Automatically only where the ring would run: the ranks learn whether every buffer can be
  // mapped from the descriptors, a round of messages that a plain buffer pays for nothing,
  // which is noise beside a ring-sized transfer but not beside halving-doubling's few.
  return requested == Algorithm::kAuto && ResolveAllReduce(bytes, algo) == Algorithm::kRing;
}

std::string TransportCommunicator::AllReduceAlgorithmFor(size_t bytes, Algorithm algo,
                                                         const void* data) const {
  if (size_ == 1) return "local";
  if (TriesDirect(bytes, algo)) {
    AllocatedRegion a;
    if (data != nullptr && FindAllocated(data, bytes, &a)) return "direct";
  }
  const Algorithm resolved = ResolveAllReduce(bytes, algo);
  // Forced kDirect where it cannot run fails; report what was asked.
  return AlgorithmName(resolved);
}

void TransportCommunicator::DoAllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                        Algorithm algo) {
  const size_t esize = DataTypeSize(type);
  const bool direct = TriesDirect(count * esize, algo);
  const Algorithm requested = algo == Algorithm::kAuto ? options().allreduce_algorithm : algo;
  if (requested == Algorithm::kDirect && size_ > 1 && !direct) {
    // Every rank sees the same SharesMemory(), so every rank throws this, before anything is
    // sent; the communicator stays usable.
    throw Error(ErrorKind::kInvalidArgument,
                StrCat("allreduce: algorithm 'direct' needs ranks that share memory (every rank "
                       "on one host, CORTADO_TRANSPORT=ucx over shared memory); this "
                       "communicator's ",
                       transport_->name(), " transport shares none"),
                -1, "allreduce");
  }
  // kDirect falls back to the ring when the ranks agree it cannot run (see DirectAllReduce).
  const Algorithm resolved = direct ? Algorithm::kDirect : ResolveAllReduce(count * esize, algo);
  const char* name = AlgorithmName(resolved);
  if (size_ == 1 || count == 0) {
    if (size_ > 1) {
      RunOp(
          "allreduce", [&] { return StrCat(name, ", 0 elements"); }, [](uint64_t, Deadline) {});
    }
    return;
  }
  auto describe = [&] {
    return StrCat(name, ", ", count, " x ", DataTypeName(type), ", ", ReduceOpName(op));
  };
  char* bytes = static_cast<char*>(data);
  RunOp("allreduce", describe, [&](uint64_t seq, Deadline deadline) {
    if (resolved == Algorithm::kDirect) {
      if (!DirectAllReduce(bytes, count, type, op, requested == Algorithm::kDirect, seq,
                           deadline)) {
        RingAllReduce(bytes, count, type, op, seq, deadline);
      }
    } else if (resolved == Algorithm::kRing) {
      RingAllReduce(bytes, count, type, op, seq, deadline);
    } else {
      HalvingDoublingAllReduce(bytes, count, type, op, seq, deadline);
    }
  });
}

void TransportCommunicator::DoAllReduceCompressed(float* data, size_t count, ReduceOp op,
                                                  const Compression& compression) {
  auto describe = [&] {
    return StrCat("ring, ", count, " x f32 as ", CodecName(compression.codec), " (",
                  RoundingName(compression.rounding), "), ", ReduceOpName(op));
  };
  RunOp("allreduce", describe, [&](uint64_t seq, Deadline deadline) {
    ScaleAndFeedBack(data, count, op == ReduceOp::kAvg ? 1.0f / static_cast<float>(size_) : 1.0f,
                     compression.residual);
    CompressedRingAllReduce(data, count, compression, seq, deadline);
  });
}

// ----------------------------------------------------------------------------------------------
// Broadcast

void TransportCommunicator::DoBroadcast(void* data, size_t count, DataType type, int root,
                                        Algorithm algo) {
  const size_t esize = DataTypeSize(type);
  const Algorithm resolved = ResolveBroadcast(count * esize, algo);
  const char* name = AlgorithmName(resolved);
  if (size_ == 1) return;
  if (count == 0) {
    RunOp(
        "broadcast", [&] { return StrCat(name, ", 0 elements"); }, [](uint64_t, Deadline) {});
    return;
  }
  auto describe = [&] {
    return StrCat(name, ", ", count, " x ", DataTypeName(type), ", root ", root);
  };
  RunOp("broadcast", describe, [&](uint64_t seq, Deadline deadline) {
    if (resolved == Algorithm::kTree) {
      TreeBroadcast(static_cast<char*>(data), count, type, root, seq, deadline);
    } else {
      ChainBroadcast(static_cast<char*>(data), count, type, root, seq, deadline);
    }
  });
}

// ----------------------------------------------------------------------------------------------
// All-gather, barrier

void TransportCommunicator::DoAllGather(const void* input, void* output, size_t count,
                                        DataType type) {
  RingAllGather("allgather", input, output, count, type);
}

void TransportCommunicator::DoBarrier() {
  if (size_ == 1) return;
  RunOp(
      "barrier", [] { return std::string("dissemination"); },
      [&](uint64_t seq, Deadline deadline) {
        // Round k: tell rank + 2^k we are here, hear it from rank - 2^k (log2(n) rounds).
        Span empty = ScratchSpan(Scratch(64), 0);
        uint32_t round = 0;
        for (int d = 1; d < size_; d *= 2, ++round) {
          uint64_t tag = MakeTag(seq, round, 0);
          RequestId q = transport_->PostRecv(Mod(rank_ - d, size_), *empty.region, 0, 0, tag);
          RequestId s = transport_->PostSend(Mod(rank_ + d, size_), *empty.region, 0, 0, tag);
          transport_->Wait(q, deadline);
          transport_->Wait(s, deadline);
        }
      });
}

// ----------------------------------------------------------------------------------------------
// Split

std::unique_ptr<Communicator> TransportCommunicator::DoSplit(int color, int key) {
  // Every rank learns every rank's (color, key): an all-gather of two int32 per rank, moved as
  // raw bytes (the ring only copies them). It is an operation of this communicator ("split").
  int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size_));
  RingAllGather("split", mine, all.data(), 2, DataType::kF32);
  // Every rank counts its splits identically (same calls, same order), so children of the same
  // split and color meet under the same store keys, and later splits under fresh ones.
  const uint64_t split = ++splits_;
  std::vector<std::pair<int32_t, int>> members;  // (key, rank here) of the ranks of my color
  for (int r = 0; r < size_; ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) {
      members.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
    }
  }
  std::sort(members.begin(), members.end());
  CommConfig child = config_;
  child.world_size = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) child.rank = static_cast<int>(i);
  }
  child.store_prefix = StrCat(config_.store_prefix, "split/", split, "/", color, "/");
  std::string ranks_here;
  for (const auto& m : members) {
    ranks_here += (ranks_here.empty() ? "" : ", ") + std::to_string(m.second);
  }
  try {
    // The child rendezvouses through the caller's store, else through the job's TCP store:
    // served in this process (shared, never a second server) or reached with a client of its
    // own, used only while the child is built.
    Store* rendezvous = config_.store;
    std::unique_ptr<TcpStore> client;
    if (child.world_size > 1 && !rendezvous) {
      if (access_.server) {
        rendezvous = &access_.server->local_store();
      } else {
        client = std::make_unique<TcpStore>(
            config_.master_addr, config_.master_port, access_.identity, access_.rank,
            Deadline::After(options().EffectiveConnectTimeout()), options().timeout);
        rendezvous = client.get();
      }
    }
    return std::make_unique<TransportCommunicator>(child, rendezvous, access_);
  } catch (const Error& e) {
    throw Error(e.kind(),
                StrCat("split: building the communicator of color ", color, " (ranks ", ranks_here,
                       " here become its ranks 0-", child.world_size - 1, "): ", e.what()),
                e.peer_rank(), "split", e.ranks());
  }
}

std::unique_ptr<Communicator> CreateTransportCommunicator(const CommConfig& config) {
  return std::make_unique<TransportCommunicator>(config);
}

}  // namespace cortado::dist::internal
