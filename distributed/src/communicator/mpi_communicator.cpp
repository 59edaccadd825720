// The MPI backend (CORTADO_BACKEND=mpi): the same collectives over a duplicate of
// MPI_COMM_WORLD (or a communicator made from it by Split), for clusters where MPI is the
// standard launcher and as a reference in tests. Each operation is issued as a non-blocking MPI
// collective and polled with MPI_Test against its deadline (continuously for 20 ms, yielding the
// core, then every 100 us).
//
// Deadlines. MPI cannot ask peers anything through a stuck collective, so each communicator
// has a status side channel: a second duplicate communicator on which a rank that polls an
// operation also answers status queries with its (ops_started, ops_finished) counters. At the
// deadline the waiting rank queries every peer and waits up to a second: a peer that does not
// answer is outside every operation of this communicator (late), one that answers with an older
// operation number is late too; the error names them as the TCP backend's does. MPI cannot
// cancel a collective either, so the communicator stays unusable: the operation throws, and the
// communicator's destructor prints the error and calls MPI_Abort, which ends every rank.
//
// Threads. Split's children may be driven from other threads than their parent (the parent's
// worker runs queued all-reduces while another thread runs the child's operations), so MPI is
// initialized with MPI_THREAD_MULTIPLE. Where the library provides less (or the program
// initialized MPI with less), every MPI call is made under one process-wide mutex, held only
// around that call, so that the non-blocking collectives of two communicators still progress.
//
// f16 and bf16 use user-defined MPI operations that accumulate in f32; f64 uses MPI_DOUBLE;
// average is a sum followed by a local division.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/reduce.h"
#include "communicator/backends.h"
#include "communicator/failure.h"

namespace cortado::dist::internal {
namespace {

// MPI reductions for 16-bit floats: MPI calls them with (in, inout).
void SumF16(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce(inout, inout, in, static_cast<size_t>(*len), DataType::kF16, ReduceOp::kSum);
}
void MaxF16(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce(inout, inout, in, static_cast<size_t>(*len), DataType::kF16, ReduceOp::kMax);
}
void SumBF16(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce(inout, inout, in, static_cast<size_t>(*len), DataType::kBF16, ReduceOp::kSum);
}
void MaxBF16(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce(inout, inout, in, static_cast<size_t>(*len), DataType::kBF16, ReduceOp::kMax);
}

std::once_flag g_init_once;
bool g_we_initialized = false;
// True when MPI provides less than MPI_THREAD_MULTIPLE: then every MPI call of this backend is
// made under g_mpi_mu. Set once, before the first communicator exists.
bool g_serialize = false;
std::mutex g_mpi_mu;

// Makes one MPI call, under g_mpi_mu when MPI is not thread-safe. The lock covers a single call,
// never a whole polled operation, so two communicators polled from two threads still interleave
// their MPI_Test calls and both progress.
template <typename Call>
int Mpi(Call call) {
  if (!g_serialize) return call();
  std::lock_guard<std::mutex> lock(g_mpi_mu);
  return call();
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void InitMpiOnce() {
  std::call_once(g_init_once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      // Communicators made by Split may be driven from different threads at the same time (a
      // parent's worker and a child's caller), so ask for full thread support.
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      g_we_initialized = true;
      std::atexit(FinalizeAtExit);
    } else {
      MPI_Query_thread(&provided);
    }
    // Less than MULTIPLE: serialize. (FUNNELED or SINGLE would forbid calls from the worker
    // thread altogether; serializing is the best this backend can do and works with Open MPI.)
    g_serialize = provided < MPI_THREAD_MULTIPLE;
  });
}

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

// Tags of the status side channel (on its own duplicate communicator, so they never meet the
// collectives' traffic).
constexpr int kQueryTag = 1;
constexpr int kAnswerTag = 2;

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm: a duplicate of MPI_COMM_WORLD, or a communicator made by Split.
  // Collective over comm (it duplicates it for the status side channel).
  MpiCommunicator(const CommOptions& options, MPI_Comm comm) : Communicator(options), comm_(comm) {
    Mpi([&] { return MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN); });
    Mpi([&] { return MPI_Comm_rank(comm_, &rank_); });
    Mpi([&] { return MPI_Comm_size(comm_, &size_); });
    Mpi([&] { return MPI_Comm_dup(comm_, &status_comm_); });
    Mpi([&] { return MPI_Comm_set_errhandler(status_comm_, MPI_ERRORS_RETURN); });
    Mpi([&] { return MPI_Op_create(SumF16, 1, &ops_[0]); });
    Mpi([&] { return MPI_Op_create(MaxF16, 1, &ops_[1]); });
    Mpi([&] { return MPI_Op_create(SumBF16, 1, &ops_[2]); });
    Mpi([&] { return MPI_Op_create(MaxBF16, 1, &ops_[3]); });
    PostQueryRecv();
  }

  ~MpiCommunicator() override {
    StopWorker();
    if (broken_.broken) {
      // A collective is still in flight somewhere and cannot be cancelled: end the job.
      std::fprintf(stderr, "cortado: rank %d: aborting the MPI job after: %s\n", rank_,
                   broken_.what.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (query_req_ != MPI_REQUEST_NULL) {
      Mpi([&] { return MPI_Cancel(&query_req_); });
      Mpi([&] { return MPI_Wait(&query_req_, MPI_STATUS_IGNORE); });
    }
    for (Answer& a : answers_) Mpi([&] { return MPI_Wait(&a.req, MPI_STATUS_IGNORE); });
    for (MPI_Op& op : ops_) Mpi([&] { return MPI_Op_free(&op); });
    Mpi([&] { return MPI_Comm_free(&status_comm_); });
    Mpi([&] { return MPI_Comm_free(&comm_); });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  std::string AllReduceAlgorithmFor(size_t, Algorithm, const void*) const override { return "mpi"; }
  std::string BroadcastAlgorithmFor(size_t, Algorithm) const override { return "mpi"; }

 protected:
  void DoAllReduce(void* data, size_t count, DataType type, ReduceOp op, Algorithm) override {
    char* p = static_cast<char*>(data);
    const size_t esize = DataTypeSize(type);
    Run("allreduce", count, [&](size_t lo, int n, MPI_Request* req) {
      return MPI_Iallreduce(MPI_IN_PLACE, p + lo * esize, n, Type(type), Op(type, op), comm_, req);
    });
    Finalize(data, count, type, op, size_);
  }

  void DoBroadcast(void* data, size_t count, DataType type, int root, Algorithm) override {
    char* p = static_cast<char*>(data);
    const size_t esize = DataTypeSize(type);
    Run("broadcast", count, [&](size_t lo, int n, MPI_Request* req) {
      return MPI_Ibcast(p + lo * esize, n, Type(type), root, comm_, req);
    });
  }

  void DoAllGather(const void* input, void* output, size_t count, DataType type) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      throw Error(ErrorKind::kInvalidArgument, "allgather (mpi): count above INT_MAX", -1,
                  "allgather");
    }
    const size_t bytes = count * DataTypeSize(type);
    char* out = static_cast<char*>(output);
    const void* in = input;
    if (input == out + static_cast<size_t>(rank_) * bytes) in = MPI_IN_PLACE;
    Run("allgather", 1, [&](size_t, int, MPI_Request* req) {
      return MPI_Iallgather(in, static_cast<int>(count), Type(type), out, static_cast<int>(count),
                            Type(type), comm_, req);
    });
  }

  void DoReduceScatter(const void* input, void* output, size_t count, DataType type,
                       ReduceOp op) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      throw Error(ErrorKind::kInvalidArgument, "reducescatter (mpi): count above INT_MAX", -1,
                  "reducescatter");
    }
    Run("reducescatter", 1, [&](size_t, int, MPI_Request* req) {
      return MPI_Ireduce_scatter_block(input, output, static_cast<int>(count), Type(type),
                                       Op(type, op), comm_, req);
    });
    Finalize(output, count, type, op, size_);
  }

  // The compressed ring of the TCP backend (see AllReduceCompressed), over point-to-point
  // messages of whole segments: MPI has no collective that re-encodes at each hop. Elements are
  // encoded at the same sites with the same random streams as over TCP, so both backends give
  // the same values.
  void DoAllReduceCompressed(float* data, size_t count, ReduceOp op,
                             const Compression& compression) override {
    const int n = size_, r = rank_;
    const CodecKind codec = compression.codec;
    auto seg_size = [&](int x) { return count / n + (static_cast<size_t>(x) < count % n ? 1 : 0); };
    auto seg_offset = [&](int x) {
      return static_cast<size_t>(x) * (count / n) + std::min<size_t>(x, count % n);
    };
    auto mod = [&](int a) { return ((a % n) + n) % n; };
    const size_t stride = (EncodedBytes(codec, seg_size(0)) + 63) / 64 * 64;
    if (stride > static_cast<size_t>(INT_MAX)) {
      Fail(ErrorKind::kInvalidArgument, "allreduce: ", count,
           " elements make encoded segments over 2 GiB, more than one MPI message takes");
    }
    scratch_.resize((2 * static_cast<size_t>(n) + 1) * stride);
    char* recv = scratch_.data();
    char* mine = recv + stride;
    char* gathered = mine + static_cast<size_t>(n) * stride;
    auto encode = [&](int t, int x) {
      EncodeOptions options;
      options.rounding = compression.rounding;
      options.seed = HopSeed(compression.seed, r, t);
      options.first_index = seg_offset(x);
      Encode(codec, data + seg_offset(x), seg_size(x), mine + static_cast<size_t>(x) * stride,
             options,
             compression.residual == nullptr ? nullptr : compression.residual + seg_offset(x));
    };
    auto bytes = [&](int x) { return static_cast<int>(EncodedBytes(codec, seg_size(x))); };
    RunSteps("allreduce", [&](uint64_t seq, Deadline deadline) {
      ScaleAndFeedBack(data, count, op == ReduceOp::kAvg ? 1.0f / static_cast<float>(n) : 1.0f,
                       compression.residual);
      for (int t = 0; t < 2 * (n - 1); ++t) {
        const bool gather = t >= n - 1;
        const int xs = gather ? mod(r + 1 - (t - (n - 1))) : mod(r - t);
        const int xr = gather ? mod(r - (t - (n - 1))) : mod(r - t - 1);
        if (!gather) encode(t, xs);
        const char* send =
            (gather && t > n - 1 ? gathered : mine) + static_cast<size_t>(xs) * stride;
        char* into = gather ? gathered + static_cast<size_t>(xr) * stride : recv;
        MPI_Request reqs[2];
        Issue("allreduce", seq,
              [&] { return MPI_Irecv(into, bytes(xr), MPI_BYTE, mod(r - 1), t, comm_, &reqs[0]); });
        Issue("allreduce", seq,
              [&] { return MPI_Isend(send, bytes(xs), MPI_BYTE, mod(r + 1), t, comm_, &reqs[1]); });
        Poll("allreduce", seq, &reqs[0], deadline);
        Poll("allreduce", seq, &reqs[1], deadline);
        float* out = data + seg_offset(xr);
        if (gather) {
          Decode(codec, into, seg_size(xr), out);
          continue;
        }
        DecodeAccumulate(codec, recv, seg_size(xr), out);
        if (t == n - 2) {  // this rank completed segment xr: encode it once, keep what others get
          encode(t, xr);
          Decode(codec, mine + static_cast<size_t>(xr) * stride, seg_size(xr), out);
        }
      }
    });
  }

  void DoBarrier() override {
    Run("barrier", 1, [&](size_t, int, MPI_Request* req) { return MPI_Ibarrier(comm_, req); });
  }

  std::unique_ptr<Communicator> DoSplit(int color, int key) override {
    // MPI_Comm_split blocks without a deadline, so first meet in a polled all-gather of
    // (color, key): it has the deadline and names a rank that never calls Split. Once it
    // completes every rank is inside Split, and MPI_Comm_split returns promptly.
    int mine[2] = {color, key};
    std::vector<int> all(2 * static_cast<size_t>(size_));
    Run("split", 1, [&](size_t, int, MPI_Request* req) {
      return MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, req);
    });
    MPI_Comm child = MPI_COMM_NULL;
    int rc = Mpi([&] { return MPI_Comm_split(comm_, color, key, &child); });
    if (rc != MPI_SUCCESS) {
      Break("split", StrCat("split #", seq_, " (mpi): MPI_Comm_split: ", MpiErrorText(rc)));
    }
    return std::make_unique<MpiCommunicator>(options(), child);
  }

 private:
  // Two counters of this rank's progress (ops_started, ops_finished) sent to a peer that asked.
  struct Answer {
    uint64_t counts[2];
    MPI_Request req = MPI_REQUEST_NULL;
  };

  MPI_Datatype Type(DataType type) const {
    switch (type) {
      case DataType::kF32:
        return MPI_FLOAT;
      case DataType::kF64:
        return MPI_DOUBLE;
      case DataType::kF16:
      case DataType::kBF16:
        return MPI_UINT16_T;
    }
    return MPI_FLOAT;
  }
  MPI_Op Op(DataType type, ReduceOp op) const {
    bool max = op == ReduceOp::kMax;
    switch (type) {
      case DataType::kF32:
      case DataType::kF64:
        return max ? MPI_MAX : MPI_SUM;
      case DataType::kF16:
        return max ? ops_[1] : ops_[0];
      case DataType::kBF16:
        return max ? ops_[3] : ops_[2];
    }
    return MPI_SUM;
  }

  // Issues the operation in pieces of at most INT_MAX elements (MPI counts are int) and polls
  // each against the operation's deadline.
  template <typename IssueFn>
  void Run(const char* name, size_t count, IssueFn issue) {
    RunSteps(name, [&](uint64_t seq, Deadline deadline) {
      const size_t kPiece = static_cast<size_t>(INT_MAX) / 2;
      for (size_t lo = 0; lo < count || (count == 0 && lo == 0); lo += kPiece) {
        int n = static_cast<int>(std::min(kPiece, count - lo));
        MPI_Request req;
        Issue(name, seq, [&] { return issue(lo, n, &req); });
        Poll(name, seq, &req, deadline);
        if (count == 0) break;
      }
    });
  }

  // One numbered operation made of several point-to-point requests (Issue + Poll each).
  template <typename Body>
  void RunSteps(const char* name, Body body) {
    broken_.ThrowIfBroken(name);
    uint64_t seq = ++seq_;
    ops_started_ = seq;
    body(seq, Deadline::After(options().timeout));
    ops_finished_ = seq;
  }

  template <typename Call>
  void Issue(const char* name, uint64_t seq, Call call) {
    int rc = Mpi(call);
    if (rc != MPI_SUCCESS) Break(name, StrCat(name, " #", seq, " (mpi): ", MpiErrorText(rc)));
  }

  // An MPI call failed inside operation `name`: nothing can cancel what is in flight.
  [[noreturn]] void Break(const char* name, const std::string& what) {
    broken_.Set(what, -1);
    throw Error(ErrorKind::kPeerFailure, what, -1, name);
  }

  void Poll(const char* name, uint64_t seq, MPI_Request* req, Deadline deadline) {
    // MPI's non-blocking collectives advance only inside MPI calls, so poll continuously
    // (yielding the core, as blocking MPI calls spin anyway) for a while, then every 100 us.
    // Status queries from peers are answered every millisecond or so: they only come at a
    // deadline, and the extra MPI_Test would otherwise double the progress calls.
    auto spin_until = Clock::now() + std::chrono::microseconds(options().spin_us);
    auto yield_until = Clock::now() + std::chrono::milliseconds(20);
    auto serve_at = Clock::now() + std::chrono::milliseconds(1);
    for (;;) {
      int done = 0;
      int rc = Mpi([&] { return MPI_Test(req, &done, MPI_STATUS_IGNORE); });
      if (rc != MPI_SUCCESS) Break(name, StrCat(name, " #", seq, " (mpi): ", MpiErrorText(rc)));
      if (done) return;
      if (deadline.Expired()) OnDeadline(name, seq);
      auto now = Clock::now();
      if (now >= serve_at) {
        ServeQueries();
        serve_at = now + std::chrono::milliseconds(1);
      }
      if (now >= yield_until) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      } else if (now >= spin_until) {
        std::this_thread::yield();
      }
    }
  }

  // The status side channel. Every rank keeps one receive for a query posted on status_comm_;
  // while it polls an operation (and only then) it answers each query with its counters. A
  // rank outside every operation of this communicator leaves the query unanswered, which is
  // how the asker learns it has not arrived.
  void PostQueryRecv() {
    int rc = Mpi([&] {
      return MPI_Irecv(&query_in_, 1, MPI_UINT64_T, MPI_ANY_SOURCE, kQueryTag, status_comm_,
                       &query_req_);
    });
    if (rc != MPI_SUCCESS) query_req_ = MPI_REQUEST_NULL;  // best effort: no answers then
  }

  void ServeQueries() {
    while (query_req_ != MPI_REQUEST_NULL) {
      int arrived = 0;
      MPI_Status status;
      if (Mpi([&] { return MPI_Test(&query_req_, &arrived, &status); }) != MPI_SUCCESS) {
        query_req_ = MPI_REQUEST_NULL;
        break;
      }
      if (!arrived) break;
      answers_.emplace_back();
      Answer& a = answers_.back();
      a.counts[0] = ops_started_;
      a.counts[1] = ops_finished_;
      if (Mpi([&] {
            return MPI_Isend(a.counts, 2, MPI_UINT64_T, status.MPI_SOURCE, kAnswerTag, status_comm_,
                             &a.req);
          }) != MPI_SUCCESS) {
        a.req = MPI_REQUEST_NULL;
      }
      PostQueryRecv();
    }
    for (auto it = answers_.begin(); it != answers_.end();) {
      int sent = 0;
      if (it->req == MPI_REQUEST_NULL ||
          Mpi([&] { return MPI_Test(&it->req, &sent, MPI_STATUS_IGNORE); }) != MPI_SUCCESS ||
          sent) {
        it = answers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // At the deadline of operation #seq: asks every peer how far it has got, then breaks the
  // communicator and throws kTimeout naming the ranks that had not arrived.
  [[noreturn]] void OnDeadline(const char* name, uint64_t seq) {
    const LateRanks late = FindLateRanks(QueryPeers(seq), rank_, seq,
                                         "did not answer: it is inside no operation of this "
                                         "communicator");
    const double secs = std::chrono::duration<double>(options().timeout).count();
    const std::string prefix = StrCat(name, " #", seq, " (mpi)");
    if (!late.ranks.empty()) {
      broken_.Set(LateRanksMessage(prefix, secs, late), late.ranks.front());
    } else {
      broken_.Set(StrCat(prefix, ": deadline of ", secs,
                         " s (CORTADO_TIMEOUT_S) passed; every rank had arrived (a stuck or very "
                         "slow link?)"),
                  -1);
    }
    throw Error(ErrorKind::kTimeout, broken_.what, broken_.rank, name, late.ranks);
  }

  // Sends every peer a status query for operation #seq on the side channel and collects the
  // answers for up to a second, answering their queries meanwhile (peers that timed out too are
  // asking as well). A peer that does not answer is reported as not responded.
  std::vector<PeerStatus> QueryPeers(uint64_t seq) {
    const size_t n = static_cast<size_t>(size_);
    std::vector<uint64_t> got(2 * n, 0);
    std::vector<MPI_Request> recvs(n, MPI_REQUEST_NULL), sends(n, MPI_REQUEST_NULL);
    query_out_ = seq;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const size_t i = static_cast<size_t>(p);
      if (Mpi([&] {
            return MPI_Irecv(&got[2 * i], 2, MPI_UINT64_T, p, kAnswerTag, status_comm_, &recvs[i]);
          }) != MPI_SUCCESS) {
        recvs[i] = MPI_REQUEST_NULL;
      }
      if (Mpi([&] {
            return MPI_Isend(&query_out_, 1, MPI_UINT64_T, p, kQueryTag, status_comm_, &sends[i]);
          }) != MPI_SUCCESS) {
        sends[i] = MPI_REQUEST_NULL;
      }
    }
    std::vector<char> answered = AwaitAnswers(&recvs);
    for (size_t i = 0; i < n; ++i) {
      // A query a late peer never received stays queued in MPI; query_out_ outlives it.
      if (sends[i] != MPI_REQUEST_NULL) Mpi([&] { return MPI_Request_free(&sends[i]); });
    }
    std::vector<PeerStatus> status(n);
    for (size_t i = 0; i < n; ++i) {
      status[i].rank = static_cast<int>(i);
      status[i].responded = answered[i] != 0;
      status[i].ops_started = got[2 * i];
      status[i].ops_finished = got[2 * i + 1];
    }
    return status;
  }

  // Polls the answers' receives for up to a second, then cancels those still open (one may
  // have matched after all); which peers answered.
  std::vector<char> AwaitAnswers(std::vector<MPI_Request>* recvs) {
    std::vector<char> answered(recvs->size(), 0);
    Deadline until = Deadline::After(std::chrono::seconds(1));
    for (;;) {
      bool pending = false;
      for (size_t i = 0; i < recvs->size(); ++i) {
        MPI_Request& recv = (*recvs)[i];
        if (recv == MPI_REQUEST_NULL) continue;
        int flag = 0;
        int rc = Mpi([&] { return MPI_Test(&recv, &flag, MPI_STATUS_IGNORE); });
        if (rc != MPI_SUCCESS) {
          recv = MPI_REQUEST_NULL;  // a broken peer: counts as not answering
        } else if (flag) {
          answered[i] = 1;
        } else {
          pending = true;
        }
      }
      ServeQueries();
      if (!pending || until.Expired()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (size_t i = 0; i < recvs->size(); ++i) {
      MPI_Request& recv = (*recvs)[i];
      if (recv == MPI_REQUEST_NULL) continue;
      // Cancelling a receive and waiting for it always returns.
      MPI_Status status;
      Mpi([&] { return MPI_Cancel(&recv); });
      Mpi([&] { return MPI_Wait(&recv, &status); });
      int cancelled = 1;
      MPI_Test_cancelled(&status, &cancelled);
      if (!cancelled) answered[i] = 1;
    }
    return answered;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm status_comm_ = MPI_COMM_NULL;  // the side channel: status queries and answers
  int rank_ = 0;
  int size_ = 1;
  MPI_Op ops_[4];
  std::vector<char> scratch_;  // the compressed all-reduce's encoded segments
  uint64_t seq_ = 0;
  uint64_t ops_started_ = 0;   // operations this rank has entered
  uint64_t ops_finished_ = 0;  // operations it has completed
  MPI_Request query_req_ = MPI_REQUEST_NULL;
  uint64_t query_in_ = 0;      // a peer's query (its operation number), received into
  uint64_t query_out_ = 0;     // this rank's query, sent from
  std::list<Answer> answers_;  // answers in flight (a list: MPI holds their addresses)
  Breakage broken_;
};

}  // namespace

std::unique_ptr<Communicator> CreateMpiCommunicator(const CommOptions& options) {
  InitMpiOnce();
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = Mpi([&] { return MPI_Comm_dup(MPI_COMM_WORLD, &comm); });
  if (rc != MPI_SUCCESS)
    Fail(ErrorKind::kSystem, "MPI_Comm_dup(MPI_COMM_WORLD): ", MpiErrorText(rc));
  return std::make_unique<MpiCommunicator>(options, comm);
}

}  // namespace cortado::dist::internal
