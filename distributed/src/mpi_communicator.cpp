// The MPI backend (CORTADO_BACKEND=mpi): the same collectives over MPI_COMM_WORLD, for clusters
// where MPI is the standard launcher and as a reference in tests. Each operation is issued as a
// non-blocking MPI collective and polled with MPI_Test against its deadline (continuously for
// 20 ms, yielding the core, then every 100 us). MPI cannot cancel a collective, so a deadline makes
// the communicator unusable: the operation throws, naming itself, and the communicator's destructor
// prints the error and calls MPI_Abort, which ends every rank of the job.
// f16 and bf16 use user-defined MPI operations that accumulate in f32; average is a sum followed
// by a local division.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "backends.h"
#include "reduce.h"

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

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void InitMpiOnce() {
  std::call_once(g_init_once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Operations may run on the communicator's worker thread, one at a time.
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      g_we_initialized = true;
      std::atexit(FinalizeAtExit);
    }
  });
}

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommOptions& options) : Communicator(options) {
    InitMpiOnce();
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(SumF16, 1, &ops_[0]);
    MPI_Op_create(MaxF16, 1, &ops_[1]);
    MPI_Op_create(SumBF16, 1, &ops_[2]);
    MPI_Op_create(MaxBF16, 1, &ops_[3]);
  }

  ~MpiCommunicator() override {
    StopWorker();
    if (broken_) {
      // A collective is still in flight somewhere and cannot be cancelled: end the job.
      std::fprintf(stderr, "cortado: rank %d: aborting the MPI job after: %s\n", rank_,
                   broken_what_.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (MPI_Op& op : ops_) MPI_Op_free(&op);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  std::string AllReduceAlgorithmFor(size_t, Algorithm) const override { return "mpi"; }
  std::string BroadcastAlgorithmFor(size_t, Algorithm) const override { return "mpi"; }

 protected:
  void DoAllReduce(void* data, size_t count, DataType type, ReduceOp op, Algorithm) override {
    char* p = static_cast<char*>(data);
    const size_t esize = DataTypeSize(type);
    Run("allreduce", count, type, [&](size_t lo, int n, MPI_Request* req) {
      return MPI_Iallreduce(MPI_IN_PLACE, p + lo * esize, n, Type(type), Op(type, op), comm_, req);
    });
    Finalize(data, count, type, op, size_);
  }

  void DoBroadcast(void* data, size_t count, DataType type, int root, Algorithm) override {
    char* p = static_cast<char*>(data);
    const size_t esize = DataTypeSize(type);
    Run("broadcast", count, type, [&](size_t lo, int n, MPI_Request* req) {
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
    Run("allgather", 1, type, [&](size_t, int, MPI_Request* req) {
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
    Run("reducescatter", 1, type, [&](size_t, int, MPI_Request* req) {
      return MPI_Ireduce_scatter_block(input, output, static_cast<int>(count), Type(type),
                                       Op(type, op), comm_, req);
    });
    Finalize(output, count, type, op, size_);
  }

  void DoBarrier() override {
    Run("barrier", 1, DataType::kF32,
        [&](size_t, int, MPI_Request* req) { return MPI_Ibarrier(comm_, req); });
  }

 private:
  MPI_Datatype Type(DataType type) const {
    return type == DataType::kF32 ? MPI_FLOAT : MPI_UINT16_T;
  }
  MPI_Op Op(DataType type, ReduceOp op) const {
    bool max = op == ReduceOp::kMax;
    switch (type) {
      case DataType::kF32:
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
  template <typename Issue>
  void Run(const char* name, size_t count, DataType, Issue issue) {
    if (broken_) {
      throw Error(
          ErrorKind::kPeerFailure,
          StrCat(name, ": the communicator is unusable after an earlier failure: ", broken_what_),
          -1, name);
    }
    uint64_t seq = ++seq_;
    Deadline deadline = Deadline::After(options().timeout);
    const size_t kPiece = static_cast<size_t>(INT_MAX) / 2;
    for (size_t lo = 0; lo < count || (count == 0 && lo == 0); lo += kPiece) {
      int n = static_cast<int>(std::min(kPiece, count - lo));
      MPI_Request req;
      int rc = issue(lo, n, &req);
      if (rc != MPI_SUCCESS) {
        broken_ = true;
        broken_what_ = StrCat(name, " #", seq, " (mpi): ", MpiErrorText(rc));
        throw Error(ErrorKind::kPeerFailure, broken_what_, -1, name);
      }
      Poll(name, seq, &req, deadline);
      if (count == 0) break;
    }
  }

  void Poll(const char* name, uint64_t seq, MPI_Request* req, Deadline deadline) {
    // MPI's non-blocking collectives advance only inside MPI calls, so poll continuously
    // (yielding the core, as blocking MPI calls spin anyway) for a while, then every 100 us.
    auto spin_until = Clock::now() + std::chrono::microseconds(options().spin_us);
    auto yield_until = Clock::now() + std::chrono::milliseconds(20);
    for (;;) {
      int done = 0;
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        broken_ = true;
        broken_what_ = StrCat(name, " #", seq, " (mpi): ", MpiErrorText(rc));
        throw Error(ErrorKind::kPeerFailure, broken_what_, -1, name);
      }
      if (done) return;
      if (deadline.Expired()) {
        double secs = std::chrono::duration<double>(options().timeout).count();
        broken_ = true;
        broken_what_ = StrCat(name, " #", seq, " (mpi): deadline of ", secs,
                              " s (CORTADO_TIMEOUT_S) passed; some rank did not arrive");
        throw Error(ErrorKind::kTimeout, broken_what_, -1, name);
      }
      auto now = Clock::now();
      if (now >= yield_until) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      } else if (now >= spin_until) {
        std::this_thread::yield();
      }
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  MPI_Op ops_[4];
  uint64_t seq_ = 0;
  bool broken_ = false;
  std::string broken_what_;
};

}  // namespace

std::unique_ptr<Communicator> CreateMpiCommunicator(const CommOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

}  // namespace cortado::dist::internal
