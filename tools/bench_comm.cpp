// `cortado bench comm` (bench_comm.h): the timed collectives, a row per size (text or JSON), and
// the command with its flags.
#include "tools/bench_comm.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "tools/commands.h"

namespace cortado::tools::bench_comm {
namespace {

Buffer MakeBuffer(dist::Communicator& comm, size_t bytes, bool registered) {
  Buffer b;
  if (registered) {
    b.registered = comm.AllocateRegistered(bytes);
    b.p = static_cast<char*>(b.registered->data());
  } else {
    b.plain.resize(bytes);
    b.p = b.plain.data();
  }
  b.bytes = bytes;
  return b;
}

double ProcessCpuMicros() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

std::vector<size_t> ParseSizes(const std::string& text) {
  size_t colon = text.find(':');
  size_t lo = ParseFlag("--sizes", [&] { return dist::ParseByteSize(text.substr(0, colon)); });
  size_t hi = colon == std::string::npos ? lo : ParseFlag("--sizes", [&] {
    return dist::ParseByteSize(text.substr(colon + 1));
  });
  if (lo == 0 || hi < lo) UsageFail("--sizes '", text, "': want MIN:MAX with 0 < MIN <= MAX");
  std::vector<size_t> out;
  for (size_t s = lo; s <= hi; s *= 2) out.push_back(s);
  return out;
}

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reducescatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

// Flag values first (usage errors, exit 2), before joining the job.
CommPlan ParsePlan(const BenchArgs& a) {
  CommPlan p;
  p.type = ParseFlag("--dtype", [&] { return dist::ParseDataType(a.dtype); });
  const bool codec_given = a.codec != "f32" && a.codec != "fp32" && a.codec != "none";
  p.reduce = !a.reduce.empty() ? a.reduce : codec_given ? "avg" : "sum";
  p.rop = ParseFlag("--reduce", [&] { return dist::ParseReduceOp(p.reduce); });
  p.algo = ParseFlag("--algo", [&] { return dist::ParseAlgorithm(a.algo); });
  p.sizes = ParseSizes(a.sizes);
  p.compression.codec = ParseFlag("--codec", [&] { return dist::ParseCodec(a.codec); });
  p.compression.rounding = ParseFlag("--rounding", [&] { return dist::ParseRounding(a.rounding); });
  p.compression.seed = 1;
  p.compressed = p.compression.codec != dist::CodecKind::kF32;
  if (p.compressed && (a.op != "allreduce" || p.type != dist::DataType::kF32)) {
    UsageFail("--codec ", a.codec,
              " compresses the all-reduce of f32 data (--op allreduce --dtype f32)");
  }
  if (p.compressed && p.rop == dist::ReduceOp::kMax) {
    UsageFail("--codec ", a.codec, " sums or averages (--reduce sum or avg), not max");
  }
  return p;
}

std::unique_ptr<dist::Communicator> JoinJob(const BenchArgs& a) {
  dist::CommOptions options = dist::CommOptions::FromEnv();
  if (!a.transport.empty()) options.transport = dist::ParseTransportKind(a.transport);
  // MPI knows rank and size itself.
  dist::CommConfig config = options.backend == dist::Backend::kMpi
                                ? dist::CommConfigFor(dist::LaunchInfo{}, options)
                                : dist::CommConfigFor(dist::DiscoverLaunchInfo(), options);
  config.fingerprint = dist::Fingerprint("bench comm");
  return dist::CreateCommunicator(config);
}

void PrintHeader(const Bench& b) {
  const BenchArgs& a = b.a;
  const bool compressed = b.plan.compressed;
  std::printf("# cortado bench comm: %s, %d rank(s), transport %s, %s memory, %s, %s%s\n",
              a.op.c_str(), b.n, b.comm.backend(), a.memory.c_str(), a.dtype.c_str(),
              b.plan.reduce.c_str(),
              compressed ? (", codec " + a.codec + " (" + a.rounding + ")").c_str() : "");
  if (compressed) {
    std::printf("# %12s  %-17s %12s %12s %12s %12s %10s %10s\n", "bytes", "algo", "time_us",
                "algbw GB/s", "busbw GB/s", "wire GB/s", "max_rel", "mean_rel");
  } else {
    std::printf("# %12s  %-17s %12s %12s %12s\n", "bytes", "algo", "time_us", "algbw GB/s",
                "busbw GB/s");
  }
  std::fflush(stdout);
}

// The algorithm a size runs, for the "algo" column.
std::string AlgoName(const Bench& b, size_t bytes) {
  if (b.a.op == "allreduce") return b.comm.AllReduceAlgorithmFor(bytes, b.plan.algo, b.in.data());
  if (b.a.op == "broadcast") return b.comm.BroadcastAlgorithmFor(bytes, b.plan.algo);
  if (b.n == 1) return "local";
  return std::string(b.comm.backend()) == "mpi" ? "mpi" : "ring";
}

}  // namespace

// One collective of `count` elements (per rank for all-gather and reduce-scatter).
void RunOnce(Bench& b, size_t count) {
  const CommPlan& p = b.plan;
  if (p.compressed) {
    b.comm.AllReduceCompressed(reinterpret_cast<float*>(b.in.data()), count, p.rop, p.compression);
  } else if (b.a.op == "allreduce") {
    b.comm.AllReduce(b.in.data(), count, p.type, p.rop, p.algo);
  } else if (b.a.op == "broadcast") {
    b.comm.Broadcast(b.in.data(), count, p.type, 0, p.algo);
  } else if (b.a.op == "allgather") {
    b.comm.AllGather(b.in.data(), b.out.data(), count, p.type);
  } else {
    b.comm.ReduceScatter(b.in.data(), b.out.data(), count, p.type, p.rop);
  }
}

namespace {

// Warm up for iters/10 + 2 runs and at least 100 ms, so caches, socket buffers and the
// scheduler's placement of the ranks have settled (the MPI and Gloo programs do the same).
void WarmUp(Bench& b, size_t count, int iters) {
  int warmup = b.a.warmup >= 0 ? b.a.warmup : iters / 10 + 2;
  auto warm_start = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup; ++i) RunOnce(b, count);
  if (b.a.warmup >= 0) return;
  // Ranks must agree on the count: rank 0 decides and broadcasts whether to go on.
  for (;;) {
    float more = std::chrono::steady_clock::now() - warm_start < std::chrono::milliseconds(100)
                     ? 1.0f
                     : 0.0f;
    b.comm.Broadcast(&more, 1, dist::DataType::kF32, 0);
    if (more == 0.0f) break;
    for (int i = 0; i < 10; ++i) RunOnce(b, count);
  }
}

// A size's timing: the slowest rank's mean time per iteration and rank 0's CPU time.
struct Timed {
  float worst_us = 0;
  double cpu_us = 0;
};

Timed TimeSize(Bench& b, size_t count, size_t bytes) {
  int iters = b.a.iters > 0 ? b.a.iters
                            : static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 5, 1000));
  WarmUp(b, count, iters);
  b.comm.Barrier();
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = ProcessCpuMicros();
  for (int i = 0; i < iters; ++i) RunOnce(b, count);
  Timed t;
  t.cpu_us = (ProcessCpuMicros() - cpu0) / iters;
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      iters;
  t.worst_us = static_cast<float>(us);
  b.comm.AllReduce(&t.worst_us, 1, dist::DataType::kF32, dist::ReduceOp::kMax);
  return t;
}

void PrintJsonLine(const nlohmann::ordered_json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// A compressed all-reduce's row: bandwidths of the f32 bytes, the wire's, and the error.
void PrintCodecRow(const Bench& b, size_t bytes, const Timed& t, const CodecError& e) {
  const BenchArgs& a = b.a;
  const double algbw = static_cast<double>(bytes) / (t.worst_us * 1e-6) / 1e9;
  const double busbw = algbw * BusFactor(a.op, b.n);
  const double wire_ratio = dist::CodecBits(b.plan.compression.codec) / 32.0;
  if (a.json) {
    nlohmann::ordered_json j;
    j["op"] = a.op;
    j["transport"] = b.comm.backend();
    j["algo"] = "ring";
    j["codec"] = a.codec;
    j["rounding"] = a.rounding;
    j["ranks"] = b.n;
    j["bytes"] = bytes;
    j["time_us"] = static_cast<double>(t.worst_us);
    j["algbw"] = algbw;
    j["busbw"] = busbw;
    j["wirebw"] = busbw * wire_ratio;
    j["cpu_us"] = t.cpu_us;
    j["max_rel_error"] = e.max;
    j["mean_rel_error"] = e.mean;
    PrintJsonLine(j);
  } else {
    std::printf("  %12zu  %-17s %12.2f %12.4f %12.4f %12.4f %10.3g %10.3g\n", bytes, "ring",
                static_cast<double>(t.worst_us), algbw, busbw, busbw * wire_ratio, e.max, e.mean);
  }
  std::fflush(stdout);
}

void PrintRow(const Bench& b, size_t bytes, const std::string& algo_name, const Timed& t) {
  const BenchArgs& a = b.a;
  const double algbw = static_cast<double>(bytes) / (t.worst_us * 1e-6) / 1e9;
  const double busbw = algbw * BusFactor(a.op, b.n);
  if (a.json) {
    nlohmann::ordered_json j;
    j["op"] = a.op;
    j["transport"] = b.comm.backend();
    j["memory"] = a.memory;
    j["algo"] = algo_name;
    j["ranks"] = b.n;
    j["bytes"] = bytes;
    j["time_us"] = static_cast<double>(t.worst_us);
    j["algbw"] = algbw;
    j["busbw"] = busbw;
    j["cpu_us"] = t.cpu_us;
    PrintJsonLine(j);
  } else {
    std::printf("  %12zu  %-17s %12.2f %12.4f %12.4f\n", bytes, algo_name.c_str(),
                static_cast<double>(t.worst_us), algbw, busbw);
  }
  std::fflush(stdout);
}

// One size: the optional check, the codec's error, then the timed runs on Fill's data.
void RunSize(Bench& b, size_t requested) {
  const bool per_rank = b.a.op == "allgather" || b.a.op == "reducescatter";
  const size_t esize = dist::DataTypeSize(b.plan.type);
  const size_t parts = per_rank ? static_cast<size_t>(b.n) : 1;
  const size_t count = requested / esize / parts;
  const size_t bytes = count * esize * parts;
  if (count == 0) return;
  const std::string algo_name = AlgoName(b, bytes);
  if (b.a.check) CheckResult(b, count, bytes);
  const CodecError error = b.plan.compressed ? MeasureCodecError(b, count) : CodecError{};
  Fill(b.in, b.plan.type, b.rank);
  const Timed t = TimeSize(b, count, bytes);
  if (b.rank != 0) return;
  if (b.plan.compressed) {
    PrintCodecRow(b, bytes, t, error);
  } else {
    PrintRow(b, bytes, algo_name, t);
  }
}

void RunBench(const BenchArgs& a) {
  if (a.codec == "auto") {
    RunAutoPlan(a);
    return;
  }
  const CommPlan plan = ParsePlan(a);
  auto comm = JoinJob(a);
  // One pair of buffers for every size, allocated once, as the trainer's gradient block is.
  const bool registered = a.memory == "registered";
  Bench b{a,
          plan,
          *comm,
          MakeBuffer(*comm, plan.sizes.back() + 64, registered),
          MakeBuffer(*comm, plan.sizes.back() + 64, registered),
          comm->size(),
          comm->rank()};
  if (b.rank == 0 && !a.json) PrintHeader(b);
  for (size_t requested : plan.sizes) RunSize(b, requested);
  comm->Barrier();
}

}  // namespace

}  // namespace cortado::tools::bench_comm

namespace cortado::tools {

void AddBenchCommCommand(CLI::App& bench) {
  auto args = std::make_shared<bench_comm::BenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "comm", "Collective bandwidth and latency (run under `cortado launch --nproc N`)");
  cmd->add_option("--op", args->op, "allreduce, broadcast, allgather or reducescatter")
      ->check(OneOf({"allreduce", "broadcast", "allgather", "reducescatter"}));
  cmd->add_option("--sizes", args->sizes, "MIN:MAX bytes (K=1024, M, G), doubling; or one size");
  cmd->add_option("--dtype", args->dtype, "f32, f16 or bf16")->check(OneOf({"f32", "f16", "bf16"}));
  cmd->add_option("--reduce", args->reduce, "sum, avg or max")
      ->check(OneOf({"sum", "avg", "max"}))
      ->default_str("sum; avg with --codec");
  cmd->add_option("--algo", args->algo,
                  "auto, ring, halving_doubling, direct (all-reduce), tree (broadcast)");
  cmd->add_option("--iters", args->iters,
                  "Timed iterations per size (0: about 256 MB moved, 5 to 1000)")
      ->check(IntAtLeast(0, "0: by size"));
  cmd->add_option("--warmup", args->warmup, "Untimed iterations per size")
      ->check(IntAtLeast(0))
      ->default_str("iters/10+2, at least 100 ms");
  cmd->add_flag("--json", args->json,
                "One JSON line per size: {op, transport, algo, ranks, bytes, time_us, algbw, "
                "busbw, cpu_us}");
  cmd->add_option("--transport", args->transport,
                  "Under Cortado's collectives: tcp or ucx (default: CORTADO_TRANSPORT, else tcp)")
      ->check(OneOf({"tcp", "ucx"}));
  cmd->add_flag("--check", args->check, "Verify one result per size before timing");
  cmd->add_option("--memory", args->memory,
                  "registered: buffers from the communicator's AllocateRegistered, as the "
                  "trainer's gradients (over UCX on one host: shared memory, so large "
                  "all-reduces run 'direct'); plain: heap memory (the ring)")
      ->check(OneOf({"registered", "plain"}));
  bench_comm::AddAutoPlanOptions(*cmd, *args);
  cmd->add_option("--codec", args->codec,
                  "All-reduce in a gradient codec: f32, f16, bf16, epgc11, epgc9, epgc8; "
                  "auto: report the plan of distributed.codec: auto for --model and --link "
                  "(reports wire bandwidth and the error against the exact result)");
  cmd->add_option("--rounding", args->rounding, "With --codec: nearest, truncate or stochastic");
  cmd->callback([args] {
    bench_comm::RunBench(*args);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
