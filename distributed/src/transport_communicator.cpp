// Collectives over a Transport: setup (rendezvous through a store, full-mesh connect) and the
// algorithms. Each algorithm is a short member function; the ring-shaped ones share one
// pipelining engine (RingPipeline).
//
// Pipelining. A ring collective is a chain of steps; step t+1 sends what step t received (after
// reducing it). Every segment is cut into chunks, and chunk-steps (t, c) flow in a fixed order
// (RingSchedule) that every rank follows for its sends and therefore, by symmetry, for its
// receives: first `lead` chunks of step 0, then after each chunk received and reduced, that
// chunk's next step followed by one more step-0 chunk. The socket thus always has data to send,
// reduced data is forwarded while still in cache, and the reduction reads the received chunk
// from a small scratch slot (L2-resident) while the next chunks are in flight. The all-gather
// half receives straight into the user's buffer; nothing is copied in user space except the
// reduction itself.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends.h"
#include "cortado/dist/transport.h"
#include "reduce.h"
#include "rendezvous.h"

namespace cortado::dist::internal {
namespace {

constexpr size_t kMinChunkBytes = 16 << 10;
// Halving-doubling exchanges whole vectors (recursive doubling, log2(p) steps) at or below this
// size, where latency dominates; above it it halves them (Rabenseifner).
constexpr size_t kRecursiveDoublingBytes = 16 << 10;

uint64_t MakeTag(uint64_t seq, uint32_t step, uint32_t chunk) {
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

// The order in which chunk-steps are sent (and received); see the file comment.
struct RingSchedule {
  std::vector<std::pair<int, int>> order;  // (step, chunk)
  std::vector<size_t> ready_after;         // sends postable once entry i has been received
  size_t initial = 0;                      // sends postable at once
};

RingSchedule MakeRingSchedule(int steps, int nchunks, int lead) {
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

int Mod(int a, int n) { return ((a % n) + n) % n; }

// How the descendants of a communicator (Split) reach the job's rendezvous store when the caller
// gave none: the process that serves the root communicator's TcpStoreServer shares it, the
// others connect a TcpStore client to master_addr:master_port with the root's identity (the
// server admits clients by the root's world size and their rank in the root).
struct StoreAccess {
  std::shared_ptr<TcpStoreServer> server;
  JobIdentity identity;
  int rank = 0;
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
  char* Scratch(size_t bytes);
  Span ScratchSpan(const char* p, size_t bytes) const {
    return Span{scratch_region_.get(), static_cast<size_t>(p - scratch_.get()), bytes};
  }
  size_t ChunkElems(size_t seg_elems, size_t esize) const;
  // Receives posted ahead in a ring pipeline (each may own a scratch chunk): enough to cover
  // what a peer can have in flight, so chunks land in place instead of waiting in the socket.
  int RecvWindow() const { return std::max(8, 4 * options().pipeline_depth); }

  template <typename SendSpan, typename RecvSpan, typename OnRecv>
  void RingPipeline(uint64_t seq, Deadline deadline, int steps, int nchunks, int to, int from,
                    SendSpan send_span, RecvSpan recv_span, OnRecv on_recv);

  void RingAllReduce(char* data, size_t count, DataType type, ReduceOp op, uint64_t seq,
                     Deadline deadline);
  void HalvingDoublingAllReduce(char* data, size_t count, DataType type, ReduceOp op, uint64_t seq,
                                Deadline deadline);
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
  bool broken_ = false;
  std::string broken_what_;
  int broken_rank_ = -1;

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
};

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
  transport_ = CreateTransportFor(options(), identity, rank_, config.master_addr);
  const std::vector<std::string> addresses =
      ExchangeAddresses(*store, config.store_prefix + "cortado/addr/", rank_, size_,
                        transport_->LocalAddress(), deadline, options().EffectiveConnectTimeout());
  transport_->Connect(addresses, deadline);
}

TransportCommunicator::~TransportCommunicator() {
  StopWorker();
  transport_.reset();
  access_.server.reset();  // the store stops when its last communicator in this process goes
}

Span TransportCommunicator::Reg(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
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

template <typename Describe, typename Body>
void TransportCommunicator::RunOp(const char* name, Describe describe, Body body) {
  if (broken_) {
    throw Error(
        ErrorKind::kPeerFailure,
        StrCat(name, ": the communicator is unusable after an earlier failure: ", broken_what_),
        broken_rank_, name);
  }
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

void TransportCommunicator::OnFailure(const char* name, const std::string& detail, uint64_t seq,
                                      const Error& e) {
  std::string prefix = StrCat(name, " #", seq, " (", detail, ")");
  std::string message;
  int root = e.peer_rank();
  std::vector<int> late;
  ErrorKind kind = e.kind() == ErrorKind::kTimeout ? ErrorKind::kTimeout : ErrorKind::kPeerFailure;
  if (e.kind() == ErrorKind::kTimeout) {
    // Find out who never got here: ask every peer how far it is (bounded to one second).
    auto status = transport_->QueryStatus(Deadline::After(std::chrono::seconds(1)));
    std::string detail_late;
    for (const auto& s : status) {
      if (s.rank == rank_) continue;
      if (!s.responded) {
        late.push_back(s.rank);
        detail_late += StrCat(detail_late.empty() ? "" : "; ", "rank ", s.rank, " did not answer");
      } else if (s.ops_started < seq) {
        late.push_back(s.rank);
        detail_late +=
            StrCat(detail_late.empty() ? "" : "; ", "rank ", s.rank, " is at operation #",
                   s.ops_started, s.ops_finished == s.ops_started ? " (finished)" : "");
      }
    }
    double secs = std::chrono::duration<double>(options().timeout).count();
    if (!late.empty()) {
      std::string list;
      for (int r : late) list += (list.empty() ? "" : ", ") + std::to_string(r);
      message = StrCat(prefix, ": deadline of ", secs, " s (CORTADO_TIMEOUT_S) passed; rank(s) ",
                       list, " did not arrive (", detail_late, ")");
      root = late.front();
    } else {
      message =
          StrCat(prefix, ": deadline of ", secs, " s (CORTADO_TIMEOUT_S) passed waiting for rank ",
                 e.peer_rank(), "; every rank had arrived (a stuck or very slow link?)");
    }
  } else {
    message = StrCat(prefix, ": ", e.what());
  }
  broken_ = true;
  broken_what_ = message;
  broken_rank_ = root;
  try {
    transport_->Abort(root, message);
  } catch (const std::exception&) {
  }
  throw Error(kind, message, root, name, late);
}

void TransportCommunicator::Exchange(int peer, const Span& send, const Span& recv, uint64_t tag,
                                     Deadline deadline) {
  RequestId r = transport_->PostRecv(peer, *recv.region, recv.offset, recv.bytes, tag);
  RequestId s = transport_->PostSend(peer, *send.region, send.offset, send.bytes, tag);
  transport_->Wait(r, deadline);
  transport_->Wait(s, deadline);
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

// ----------------------------------------------------------------------------------------------
// All-reduce

void TransportCommunicator::DoAllReduce(void* data, size_t count, DataType type, ReduceOp op,
                                        Algorithm algo) {
  const size_t esize = DataTypeSize(type);
  std::string name = AllReduceAlgorithmFor(count * esize, algo);
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
    if (name == "ring") {
      RingAllReduce(bytes, count, type, op, seq, deadline);
    } else {
      HalvingDoublingAllReduce(bytes, count, type, op, seq, deadline);
    }
  });
}

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

// The ring of RingAllReduce with encoded chunks (see Communicator::AllReduceCompressed). Every
// (segment, chunk) has a fixed slot of `stride` bytes in two encoded copies of the vector:
// `mine` holds what this rank encodes (each element exactly once: its partial sum on the way
// round, or the final value of the segment it completes), `gathered` what the all-gather
// brings in, forwarded as received (never re-encoded, so every rank decodes the same bytes).
// Chunks are a multiple of 8 elements, so each starts on a whole group of the packed formats.
void TransportCommunicator::CompressedRingAllReduce(float* data, size_t count,
                                                    const Compression& compression, uint64_t seq,
                                                    Deadline deadline) {
  const int n = size_, r = rank_;
  const CodecKind codec = compression.codec;
  Segments seg{count, n};
  const size_t max_seg = seg.Size(0);
  const size_t chunk = ChunkElems(max_seg, sizeof(float));
  const int nchunks = static_cast<int>(std::max<size_t>(1, (max_seg + chunk - 1) / chunk));
  const int window = RecvWindow();
  const size_t stride = (EncodedBytes(codec, chunk) + 63) / 64 * 64;
  const size_t slots = static_cast<size_t>(n) * static_cast<size_t>(nchunks);
  char* base = Scratch((static_cast<size_t>(window) + 2 * slots) * stride);
  char* recv_slots = base;
  char* mine = base + static_cast<size_t>(window) * stride;
  char* gathered = mine + slots * stride;
  auto slot_of = [&](char* copy, int x, int c) {
    return copy + (static_cast<size_t>(x) * nchunks + static_cast<size_t>(c)) * stride;
  };
  auto range = [&](int x, int c, size_t* lo, size_t* len) {
    size_t sz = seg.Size(x);
    size_t a = std::min(static_cast<size_t>(c) * chunk, sz);
    *lo = seg.Offset(x) + a;
    *len = std::min(chunk, sz - a);
  };
  auto send_seg = [&](int t) { return t < n - 1 ? Mod(r - t, n) : Mod(r + 1 - (t - (n - 1)), n); };
  auto recv_seg = [&](int t) { return t < n - 1 ? Mod(r - t - 1, n) : Mod(r - (t - (n - 1)), n); };
  // Encodes elements [lo, lo + len) of data into dst as ring step t's encoding site.
  auto encode = [&](int t, size_t lo, size_t len, char* dst) {
    EncodeOptions options;
    options.rounding = compression.rounding;
    options.seed = HopSeed(compression.seed, r, t);
    options.first_index = lo;
    Encode(codec, data + lo, len, dst, options,
           compression.residual == nullptr ? nullptr : compression.residual + lo);
  };
  RingPipeline(
      seq, deadline, 2 * (n - 1), nchunks, Mod(r + 1, n), Mod(r - 1, n),
      [&](int t, int c) {
        const int x = send_seg(t);
        size_t lo, len;
        range(x, c, &lo, &len);
        char* p;
        if (t < n - 1) {
          // Reduce-scatter: this rank's partial sum of the chunk (its own value at step 0).
          p = slot_of(mine, x, c);
          encode(t, lo, len, p);
        } else {
          // All-gather: the completed chunk (encoded by this rank at step n-2), or one received.
          p = slot_of(t == n - 1 ? mine : gathered, x, c);
        }
        return ScratchSpan(p, EncodedBytes(codec, len));
      },
      [&](int t, int c, int slot) {
        size_t lo, len;
        range(recv_seg(t), c, &lo, &len);
        char* p = t < n - 1 ? recv_slots + static_cast<size_t>(slot) * stride
                            : slot_of(gathered, recv_seg(t), c);
        return ScratchSpan(p, EncodedBytes(codec, len));
      },
      [&](int t, int c, int slot, auto&&) {
        const int x = recv_seg(t);
        size_t lo, len;
        range(x, c, &lo, &len);
        if (t >= n - 1) {
          Decode(codec, slot_of(gathered, x, c), len, data + lo);
          return;
        }
        DecodeAccumulate(codec, recv_slots + static_cast<size_t>(slot) * stride, len, data + lo);
        if (t == n - 2) {
          // This rank completed the chunk: encode it once, and keep what the others will get.
          char* p = slot_of(mine, x, c);
          encode(t, lo, len, p);
          Decode(codec, p, len, data + lo);
        }
      });
}

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

// ----------------------------------------------------------------------------------------------
// Broadcast

void TransportCommunicator::DoBroadcast(void* data, size_t count, DataType type, int root,
                                        Algorithm algo) {
  const size_t esize = DataTypeSize(type);
  std::string name = BroadcastAlgorithmFor(count * esize, algo);
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
    if (name == "tree") {
      TreeBroadcast(static_cast<char*>(data), count, type, root, seq, deadline);
    } else {
      ChainBroadcast(static_cast<char*>(data), count, type, root, seq, deadline);
    }
  });
}

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

// ----------------------------------------------------------------------------------------------
// All-gather, reduce-scatter, barrier

void TransportCommunicator::DoAllGather(const void* input, void* output, size_t count,
                                        DataType type) {
  RingAllGather("allgather", input, output, count, type);
}

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

}  // namespace

std::unique_ptr<Communicator> CreateTransportCommunicator(const CommConfig& config) {
  return std::make_unique<TransportCommunicator>(config);
}

}  // namespace cortado::dist::internal
