// `cortado bench comm [--op allreduce] [--sizes 4K:128M] [--json]`: collective bandwidth and
// latency, run under `cortado launch --nproc N` (or mpirun, with CORTADO_BACKEND=cortado|mpi),
// over the transport --transport (or CORTADO_TRANSPORT) names: tcp or ucx. Each line reports
// the transport ("tcp", "ucx", "mpi"; "local" for one rank) and cpu_us, rank 0's process CPU
// time per iteration (all its threads: the cost of driving progress, beside time_us).
// Buffers are f32 (or --dtype), allocated once with the communicator's AllocateRegistered as
// the trainer's gradient block is (--memory plain: heap memory); over UCX with every rank on one
// host that is shared memory, and large all-reduces run the "direct" algorithm (the "algo"
// column says which ran). Sizes are in bytes (K = 1024), doubling between the bounds.
// Figures follow nccl-tests: algbw = bytes / time (GB/s = 1e9 bytes/s); busbw = algbw x
// 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and reduce-scatter (bytes: the whole
// n-rank buffer), x 1 for broadcast. The time is the slowest rank's mean over the iterations.
// With --codec (all-reduce of f32 data, averaged as the trainer does), algbw and busbw count
// the f32 bytes reduced (the effective bandwidth); wire GB/s is busbw scaled to the encoded
// size, what each link really carried; and one run on random-like gradients before timing
// gives the largest and mean relative error of the result against the exact average (computed
// in f64; see CodecInput).
// With --codec auto it reports instead the plan `distributed.codec: auto` would make for
// --model on a link of --link (bytes/s, or 100mbit, 1gbit...) for --ranks ranks: it trains a
// few steps of the model on synthetic data on this machine, alone, to measure when backward makes
// each gradient bucket ready, and plans as a run's DataParallel does (its log lines, then one
// line per bucket on stdout, or one JSON object with --json). It needs no other rank.
//
// Files: bench_comm.cpp (the timed collectives, their rows and the command's flags),
// bench_comm_check.cpp (what results are checked against: --check's known data and a codec's
// error against the exact average), bench_comm_auto.cpp (--codec auto: the plan for a model and a
// link). This header is theirs alone.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cortado/dist/communicator.h"
#include "tools/command_line.h"

namespace cortado::tools::bench_comm {

struct BenchArgs {
  std::string op = "allreduce";
  std::string sizes = "4K:128M";
  std::string dtype = "f32";
  std::string reduce;  // default: sum; avg with --codec (what the trainer does)
  std::string algo = "auto";
  int iters = 0;  // 0: about 256 MB moved per size, between 5 and 1000 iterations
  int warmup = -1;
  bool json = false;
  bool check = false;
  std::string codec = "f32";  // all-reduce only: the compressed ring with this codec
  std::string rounding = "nearest";
  std::string transport;  // "": CORTADO_TRANSPORT, else tcp
  std::string memory =
      "registered";  // buffers from AllocateRegistered (as the trainer's), or plain
  // --codec auto: the plan for a model and a link.
  std::string model = "resnet50";
  int batch = 16;
  std::string link = "1gbit";
  int ranks = 2;
  int threads = 0;
  double bucket_mb = 25;
};

// A buffer of the benchmark: from the communicator's AllocateRegistered, or plain heap memory.
struct Buffer {
  std::unique_ptr<dist::RegisteredMemory> registered;
  std::vector<char> plain;
  char* p = nullptr;
  size_t bytes = 0;
  char* data() const { return p; }
  size_t size() const { return bytes; }
};

// What the flags settle for a timed run, all checked before joining the job.
struct CommPlan {
  dist::DataType type = dist::DataType::kF32;
  std::string reduce;
  dist::ReduceOp rop = dist::ReduceOp::kSum;
  dist::Algorithm algo = dist::Algorithm::kAuto;
  std::vector<size_t> sizes;
  dist::Compression compression;
  bool compressed = false;
};

// The joined job, the plan and the pair of buffers every size reuses.
struct Bench {
  const BenchArgs& a;
  const CommPlan& plan;
  dist::Communicator& comm;
  Buffer in, out;
  int n = 1, rank = 0;
};

// A codec's relative error: the largest over the ranks, and rank 0's mean.
struct CodecError {
  double max = 0, mean = 0;
};

// Defined in bench_comm.cpp. One collective of `count` elements (per rank for all-gather and
// reduce-scatter).
void RunOnce(Bench& b, size_t count);

// Defined in bench_comm_check.cpp. Fills a buffer with known data (element i of rank r: (i + r)
// mod 7), which --check verifies and the timed runs reduce.
void Fill(Buffer& buf, dist::DataType type, int rank);
// --check: one verified run on known data before timing.
void CheckResult(Bench& b, size_t count, size_t bytes);
// Accuracy against the exact average of random-like inputs, before timing.
CodecError MeasureCodecError(Bench& b, size_t count);

// Defined in bench_comm_auto.cpp. The plan of `distributed.codec: auto` for a.model on a link of
// a.link.
void RunAutoPlan(const BenchArgs& a);
// The options of --codec auto only (the plan for a model and a link); registered in their
// place among the others, so the help lists them in the same order.
void AddAutoPlanOptions(CLI::App& cmd, BenchArgs& args);

}  // namespace cortado::tools::bench_comm
