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
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cortado/dist/communicator.h"
#include "engine/base/error.h"
#include "engine/base/random.h"
#include "engine/base/thread_pool.h"
#include "engine/parallel/data_parallel.h"
#include "models/builders.h"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace cortado::tools {
namespace {

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

// "100mbit", "1gbit", "2.5gbit", "800kbit" (bits per second) or a plain number of bytes/s.
double ParseLinkRate(const std::string& text) {
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  double bytes_per_s = 0;
  if (used > 0 && unit.empty()) {
    bytes_per_s = value;
  } else if (used > 0 && (unit == "kbit" || unit == "mbit" || unit == "gbit")) {
    bytes_per_s = value / 8 * (unit == "kbit" ? 1e3 : unit == "mbit" ? 1e6 : 1e9);
  }
  if (!(bytes_per_s > 0) || !std::isfinite(bytes_per_s)) {
    UsageFail("--link ", text, ": want a rate such as 100mbit, 1gbit or a number of bytes/s");
  }
  return bytes_per_s;
}

// The shapes the plan is made for: ImageNet-style models on 224x224 images of 1000 classes, the
// others on 32x32 of 10 (the shapes of scripts/bench/scaling.sh).
ModelOptions AutoPlanShapes(const BenchArgs& a) {
  const bool imagenet = a.model.rfind("vgg", 0) == 0 || a.model == "resnet18" ||
                        a.model == "resnet34" || a.model == "resnet50" || a.model == "resnet101" ||
                        a.model == "resnet152";
  ModelOptions mo;
  mo.batch_size = a.batch;
  mo.in_channels = 3;
  mo.height = mo.width = imagenet ? 224 : 32;
  mo.num_classes = mo.height == 224 ? 1000 : 10;
  return mo;
}

// Trains `steps` steps on random data, so that dp measures when backward makes each bucket
// ready and makes its plan after them.
void RunPlanSteps(Net& net, DataParallel& dp, int64_t num_classes, int64_t steps) {
  Rng rng(1);
  for (int step = 0; step < steps; ++step) {
    Tensor& x = net.input("data");
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(rng.Normal(0, 1));
    Tensor& label = net.input("label");
    for (int64_t i = 0; i < label.numel(); ++i) {
      label.data<int32_t>()[i] = static_cast<int32_t>(i % num_classes);
    }
    dp.BeginStep(step);
    const double loss = net.Forward();
    dp.SetControl(loss, false);
    net.Backward();
    dp.FinishStep();
  }
}

// The plan: one JSON object, or a heading and one line per bucket.
void PrintAutoPlan(const BenchArgs& a, double rate, const DataParallel& dp) {
  const auto& buckets = dp.buckets();
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = a.model;
    j["batch"] = a.batch;
    j["link_bytes_per_s"] = rate;
    j["ranks"] = a.ranks;
    j["codec_plan"] = dp.codec_plan();
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& b : buckets) {
      list.push_back({{"first", b.first},
                      {"last", b.last},
                      {"bytes", (b.end - b.begin) * 4},
                      {"codec", dist::CodecName(b.codec)}});
    }
    j["buckets"] = list;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("# cortado bench comm --codec auto: %s, batch %d per rank, %d ranks, link %.4g B/s\n",
              a.model.c_str(), a.batch, a.ranks, rate);
  std::printf("# %6s  %12s  %-7s  %s\n", "bucket", "bytes", "codec", "parameters");
  for (size_t i = 0; i < buckets.size(); ++i) {
    const auto& b = buckets[i];
    std::printf("  %6zu  %12lld  %-7s  %s .. %s\n", i,
                static_cast<long long>((b.end - b.begin) * 4), dist::CodecName(b.codec),
                b.first.c_str(), b.last.c_str());
  }
}

// The plan of `distributed.codec: auto` for a.model on a link of a.link.
void RunAutoPlan(const BenchArgs& a) {
  const double rate = ParseLinkRate(a.link);
  if (a.threads > 0) SetNumThreads(a.threads);
  const ModelOptions mo = AutoPlanShapes(a);
  Net net(ParseFlag("--model", [&] { return BuildModel(a.model, mo); }), 1);
  auto comm = dist::CreateCommunicator(dist::CommConfig{});  // alone: only timing is measured
  CodecPolicy policy;
  policy.codec = "auto";
  ApplyCodecPolicy(net, policy);
  DataParallelOptions o;
  o.bucket_mb = a.bucket_mb;
  o.auto_codec.enabled = true;
  o.auto_codec.warmup_steps = 3;  // the first is left out
  o.auto_codec.interval = 0;
  o.auto_codec.plan_world_size = a.ranks;
  o.auto_codec.link_override = {{0, rate}};
  DataParallel dp(net, *comm, o);
  RunPlanSteps(net, dp, mo.num_classes, o.auto_codec.warmup_steps);
  PrintAutoPlan(a, rate, dp);
}

// A buffer of the benchmark: from the communicator's AllocateRegistered, or plain heap memory.
struct Buffer {
  std::unique_ptr<dist::RegisteredMemory> registered;
  std::vector<char> plain;
  char* p = nullptr;
  size_t bytes = 0;
  char* data() const { return p; }
  size_t size() const { return bytes; }
};

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

void Fill(Buffer& buf, dist::DataType type, int rank) {
  size_t count = buf.size() / dist::DataTypeSize(type);
  for (size_t i = 0; i < count; ++i) {
    float v = static_cast<float>((i + static_cast<size_t>(rank)) % 7);
    if (type == dist::DataType::kF32) {
      reinterpret_cast<float*>(buf.data())[i] = v;
    } else if (type == dist::DataType::kF16) {
      reinterpret_cast<uint16_t*>(buf.data())[i] = dist::FloatToHalf(v);
    } else {
      reinterpret_cast<uint16_t*>(buf.data())[i] = dist::FloatToBFloat16(v);
    }
  }
}

// Random-like gradients: per element a sign and a magnitude between 2^-12 and 2^-5 shared by the
// ranks, each rank within +-25% of it, so the exact sum is well conditioned and the relative
// error measures the codec (with cancelling values it would measure the cancellation).
// Deterministic in rank and index, so every rank can compute the exact result.
uint32_t Mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  return h ^ (h >> 16);
}
float CodecInput(int rank, size_t i) {
  const uint32_t h = Mix(static_cast<uint32_t>(i));
  const float unit = static_cast<float>(h % 20001u) / 20000.0f + 0.5f;  // [0.5, 1.5]
  const float base = std::ldexp(h & 1u ? unit : -unit, static_cast<int>(h >> 29) - 12);
  const uint32_t g =
      Mix(static_cast<uint32_t>(i) ^ (static_cast<uint32_t>(rank) + 1) * 0x9e3779b9u);
  return base * (1.0f + 0.25f * (static_cast<float>(g % 20001u) / 10000.0f - 1.0f));
}

float ValueAt(const Buffer& buf, dist::DataType type, size_t i) {
  if (type == dist::DataType::kF32) return reinterpret_cast<const float*>(buf.data())[i];
  uint16_t b = reinterpret_cast<const uint16_t*>(buf.data())[i];
  return type == dist::DataType::kF16 ? dist::HalfToFloat(b) : dist::BFloat16ToFloat(b);
}

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

// The joined job, the plan and the pair of buffers every size reuses.
struct Bench {
  const BenchArgs& a;
  const CommPlan& plan;
  dist::Communicator& comm;
  Buffer in, out;
  int n = 1, rank = 0;
};

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

// Element i of the result when every rank's input is Fill's.
float ExpectedValue(const Bench& b, size_t count, size_t i) {
  const std::string& op = b.a.op;
  if (op == "broadcast") return static_cast<float>(i % 7);
  if (op == "allgather") return static_cast<float>((i % count + i / count) % 7);
  size_t base = op == "reducescatter" ? i + static_cast<size_t>(b.rank) * count : i;
  float sum = 0, mx = 0;
  for (int r = 0; r < b.n; ++r) {
    float v = static_cast<float>((base + static_cast<size_t>(r)) % 7);
    sum += v;
    mx = std::max(mx, v);
  }
  const dist::ReduceOp rop = b.plan.rop;
  return rop == dist::ReduceOp::kMax ? mx : rop == dist::ReduceOp::kAvg ? sum / b.n : sum;
}

// --check: one verified run on known data before timing.
void CheckResult(Bench& b, size_t count, size_t bytes) {
  const std::string& op = b.a.op;
  Fill(b.in, b.plan.type, b.rank);
  RunOnce(b, count);
  const Buffer& res = (op == "allgather" || op == "reducescatter") ? b.out : b.in;
  size_t check_count = op == "allgather" ? count * static_cast<size_t>(b.n) : count;
  for (size_t i = 0; i < check_count; ++i) {
    const float want = ExpectedValue(b, count, i);
    float got = ValueAt(res, b.plan.type, i);
    if (std::fabs(got - want) > 1e-2f * std::max(1.0f, std::fabs(want))) {
      Fail("bench comm --check: ", op, " of ", bytes, " bytes: element ", i, " is ", got,
           ", expected ", want, " (rank ", b.rank, ")");
    }
  }
}

// A codec's relative error: the largest over the ranks, and rank 0's mean.
struct CodecError {
  double max = 0, mean = 0;
};

// Accuracy against the exact average of random-like inputs, before timing.
CodecError MeasureCodecError(Bench& b, size_t count) {
  float* x = reinterpret_cast<float*>(b.in.data());
  for (size_t i = 0; i < count; ++i) x[i] = CodecInput(b.rank, i);
  RunOnce(b, count);
  double max_rel = 0, sum_rel = 0;
  size_t counted = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < b.n; ++r) exact += CodecInput(r, i);
    exact = b.plan.rop == dist::ReduceOp::kAvg ? exact / b.n : exact;
    if (exact == 0) continue;
    const double rel = std::fabs(x[i] - exact) / std::fabs(exact);
    max_rel = std::max(max_rel, rel);
    sum_rel += rel;
    ++counted;
  }
  CodecError e;
  e.max = max_rel;
  e.mean = counted ? sum_rel / static_cast<double>(counted) : 0;
  b.comm.AllReduce(&e.max, 1, dist::DataType::kF64, dist::ReduceOp::kMax);
  return e;
}

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

// The options of --codec auto only (the plan for a model and a link); registered in their
// place among the others, so the help lists them in the same order.
void AddAutoPlanOptions(CLI::App& cmd, BenchArgs& args) {
  cmd.add_option("--model", args.model, "With --codec auto: the model to plan for");
  cmd.add_option("--batch", args.batch, "With --codec auto: per-rank batch")->check(IntAtLeast(1));
  cmd.add_option("--link", args.link,
                 "With --codec auto: the link's rate (100mbit, 1gbit, ... or bytes/s)");
  cmd.add_option("--ranks", args.ranks, "With --codec auto: ranks of the job planned for")
      ->check(IntAtLeast(2));
  cmd.add_option("--threads", args.threads, "With --codec auto: compute threads (0: default)")
      ->check(IntAtLeast(0));
  cmd.add_option("--bucket-mb", args.bucket_mb, "With --codec auto: distributed.bucket_mb");
}

}  // namespace

void AddBenchCommCommand(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
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
  AddAutoPlanOptions(*cmd, *args);
  cmd->add_option("--codec", args->codec,
                  "All-reduce in a gradient codec: f32, f16, bf16, epgc11, epgc9, epgc8; "
                  "auto: report the plan of distributed.codec: auto for --model and --link "
                  "(reports wire bandwidth and the error against the exact result)");
  cmd->add_option("--rounding", args->rounding, "With --codec: nearest, truncate or stochastic");
  cmd->callback([args] {
    RunBench(*args);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
