// `cortado bench codec [--json] [--count N] [--rounds R] [--codec C,...] [--rounding M,...]
// [--cpu-time]`
// Single-thread throughput of the gradient codecs (cortado/dist/codec.h): Encode, Encode with
// the residual, and DecodeAccumulate, each as GB/s of fp32 input (count * 4 bytes / time, GB =
// 1e9 bytes), the median of R timed rounds with their min and max, beside baselines measured
// in the same run on the same buffers: memcpy of the fp32 bytes, a scalar fp32 -> f16 loop
// (dist::FloatToHalf) and, where the CPU has F16C, a _mm256_cvtps_ph loop. The default count
// (8M floats, 32 MiB) mostly misses the caches; --count 64K stays in them. A round repeats the
// call until it has covered at least 8M values, so small counts time something measurable.
// CORTADO_CODEC_ISA=portable|avx2|avx512 chooses the kernels (printed). --cpu-time times each
// round by the thread's CPU time instead of the wall clock: on a shared, oversubscribed machine
// the time the thread waited for a core then does not count (its memory traffic still
// competes with the others').
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cortado/dist/codec.h"
#include "cortado/dist/env.h"
#include "cortado/dist/types.h"
#include "engine/base/error.h"
#include "tools/command_line.h"
#include "tools/commands.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CORTADO_BENCH_HAVE_F16C 1
#else
#define CORTADO_BENCH_HAVE_F16C 0
#endif

namespace cortado::tools {
namespace {

struct BenchArgs {
  std::string count = "8M";
  int rounds = 7;
  std::string codecs = "f32,f16,bf16,epgc11,epgc9,epgc8";
  std::string roundings = "nearest,truncate,stochastic";
  bool json = false;
  bool cpu_time = false;
};

struct Stat {
  double median = 0, min = 0, max = 0;  // GB/s
};

nlohmann::ordered_json ToJson(const Stat& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool g_cpu_time = false;  // --cpu-time

// Seconds on the wall clock, or of this thread's CPU time with --cpu-time.
double Now() {
  if (g_cpu_time) {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times fn (one pass over `count` values) `rounds` times after one untimed pass; each round
// runs it `reps` times. GB/s of count * 4 bytes per pass.
Stat Measure(size_t count, int rounds, size_t reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> rates;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = Now();
    for (size_t i = 0; i < reps; ++i) fn();
    const double s = Now() - t0;
    rates.push_back(static_cast<double>(count) * 4 * static_cast<double>(reps) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  const double median = n % 2 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
  return {median, rates.front(), rates.back()};
}

#if CORTADO_BENCH_HAVE_F16C
bool CpuHasF16c() { return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c"); }

__attribute__((target("avx,f16c"))) void CvtpsPh(const float* src, size_t count, uint16_t* dst) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < count; ++i) dst[i] = dist::FloatToHalf(src[i]);
}
#endif

std::string Cell(const Stat& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%6.2f [%5.2f,%6.2f]", s.median, s.min, s.max);
  return buf;
}

// The baselines every row is compared with, measured after an untimed warm-up.
struct Baselines {
  Stat memcpy_stat;
  Stat scalar_stat;
  bool have_f16c = false;
  Stat f16c_stat;
};

Baselines MeasureBaselines(const std::vector<float>& src, std::vector<float>& copy,
                           std::vector<uint16_t>& halves, int rounds, size_t reps) {
  const size_t count = src.size();
  // Untimed memcpy passes for a quarter second first: measured cold, the first baseline came
  // out below the same memcpy timed later in the run (the f32 row), which skewed every ratio.
  for (const auto t0 = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(250);) {
    std::memcpy(copy.data(), src.data(), count * 4);
  }
  Baselines b;
  b.memcpy_stat =
      Measure(count, rounds, reps, [&] { std::memcpy(copy.data(), src.data(), count * 4); });
  b.scalar_stat = Measure(count, rounds, reps, [&] {
    for (size_t i = 0; i < count; ++i) halves[i] = dist::FloatToHalf(src[i]);
  });
#if CORTADO_BENCH_HAVE_F16C
  if (CpuHasF16c()) {
    b.have_f16c = true;
    b.f16c_stat = Measure(count, rounds, reps, [&] { CvtpsPh(src.data(), count, halves.data()); });
  }
#endif
  return b;
}

// The run's description and baselines: JSON fields, or the text table's heading.
void StartReport(const BenchArgs& a, size_t count, size_t reps, const Baselines& b,
                 nlohmann::ordered_json& json) {
  const char* isa = dist::CodecIsa();
  json["count"] = count;
  json["bytes"] = count * 4;
  json["rounds"] = a.rounds;
  json["reps_per_round"] = reps;
  json["threads"] = 1;
  json["clock"] = a.cpu_time ? "thread_cpu_time" : "wall";
  json["isa"] = isa;
  json["unit"] = "GB/s of fp32 input (1e9 bytes/s)";
  json["baselines"]["memcpy"] = ToJson(b.memcpy_stat);
  json["baselines"]["float_to_half_scalar"] = ToJson(b.scalar_stat);
  if (b.have_f16c) json["baselines"]["f16c_cvtps_ph"] = ToJson(b.f16c_stat);
  json["results"] = nlohmann::ordered_json::array();
  if (a.json) return;
  std::printf(
      "# cortado bench codec: %zu floats (%.1f MiB of fp32), %d rounds of %zu pass(es), "
      "one thread, kernels: %s%s\n",
      count, count * 4.0 / (1 << 20), a.rounds, reps, isa,
      a.cpu_time ? ", timed by thread CPU time" : "");
  std::printf("# GB/s of fp32 input: median [min, max]\n");
  std::printf("# baseline  memcpy            %s\n", Cell(b.memcpy_stat).c_str());
  std::printf("# baseline  FloatToHalf loop  %s\n", Cell(b.scalar_stat).c_str());
  if (b.have_f16c) std::printf("# baseline  F16C cvtps_ph     %s\n", Cell(b.f16c_stat).c_str());
  std::printf("%-7s %-10s %-22s %-22s %-22s %8s %8s\n", "codec", "rounding", "encode",
              "encode+residual", "decode_accumulate", "enc/cpy", "dacc/cpy");
  std::fflush(stdout);
}

void RunBench(const BenchArgs& a) {
  // K = 1024, M, G: a count of floats
  const size_t count = ParseFlag("--count", [&] { return dist::ParseByteSize(a.count); });
  if (count == 0) UsageFail("--count '", a.count, "': want a positive number of floats");
  if (a.rounds < 1) UsageFail("--rounds ", a.rounds, ": want at least 1");
  std::vector<dist::CodecKind> kinds;
  for (const std::string& name : SplitList(a.codecs)) {
    kinds.push_back(ParseFlag("--codec", [&] { return dist::ParseCodec(name); }));
  }
  std::vector<dist::Rounding> roundings;
  for (const std::string& name : SplitList(a.roundings)) {
    roundings.push_back(ParseFlag("--rounding", [&] { return dist::ParseRounding(name); }));
  }
  if (kinds.empty() || roundings.empty()) {
    UsageFail("--codec and --rounding need at least one name");
  }
  g_cpu_time = a.cpu_time;
  const size_t reps = std::max<size_t>(1, (size_t{8} << 20) / count);

  // Gradient-like input: normal, a spread of exponents around 1e-2.
  std::vector<float> src(count), residual(count, 0.0f), acc(count, 0.0f), copy(count);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  for (float& v : src) v = normal(gen);
  std::vector<uint8_t> encoded(dist::EncodedBytes(dist::CodecKind::kF32, count));
  std::vector<uint16_t> halves(count);

  const Baselines baselines = MeasureBaselines(src, copy, halves, a.rounds, reps);
  const Stat& memcpy_stat = baselines.memcpy_stat;
  nlohmann::ordered_json json;
  StartReport(a, count, reps, baselines, json);
  for (dist::CodecKind kind : kinds) {
    // f32 is a copy whatever the rounding: one row.
    const std::vector<dist::Rounding> modes =
        kind == dist::CodecKind::kF32 ? std::vector<dist::Rounding>{roundings.front()} : roundings;
    for (dist::Rounding rounding : modes) {
      dist::EncodeOptions options;
      options.rounding = rounding;
      options.seed = 12345;
      const Stat enc = Measure(count, a.rounds, reps, [&] {
        dist::Encode(kind, src.data(), count, encoded.data(), options);
      });
      const Stat enc_res = Measure(count, a.rounds, reps, [&] {
        dist::Encode(kind, src.data(), count, encoded.data(), options, residual.data());
      });
      const Stat dacc = Measure(count, a.rounds, reps, [&] {
        dist::DecodeAccumulate(kind, encoded.data(), count, acc.data());
      });
      const double enc_ratio = enc.median / memcpy_stat.median;
      const double dacc_ratio = dacc.median / memcpy_stat.median;
      const char* mode = kind == dist::CodecKind::kF32 ? "-" : dist::RoundingName(rounding);
      if (a.json) {
        nlohmann::ordered_json row;
        row["codec"] = dist::CodecName(kind);
        row["rounding"] = mode;
        row["bits"] = dist::CodecBits(kind);
        row["encode"] = ToJson(enc);
        row["encode_residual"] = ToJson(enc_res);
        row["decode_accumulate"] = ToJson(dacc);
        row["encode_vs_memcpy"] = enc_ratio;
        row["decode_accumulate_vs_memcpy"] = dacc_ratio;
        json["results"].push_back(row);
      } else {
        std::printf("%-7s %-10s %-22s %-22s %-22s %8.2f %8.2f\n", dist::CodecName(kind), mode,
                    Cell(enc).c_str(), Cell(enc_res).c_str(), Cell(dacc).c_str(), enc_ratio,
                    dacc_ratio);
        std::fflush(stdout);
      }
    }
  }
  if (a.json)
    std::printf("%s\n",
                json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

void AddBenchCodecCommand(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "codec", "Gradient codec throughput, one thread (encode, decode-accumulate GB/s)");
  cmd->add_option("--count", args->count, "Floats per call (K = 1024, M, G); 64K stays in cache");
  cmd->add_option("--rounds", args->rounds, "Timed rounds; the median is reported")
      ->check(IntAtLeast(1));
  cmd->add_option("--codec", args->codecs, "Codecs, comma-separated");
  cmd->add_option("--rounding", args->roundings, "Rounding modes, comma-separated");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--cpu-time", args->cpu_time,
                "Time rounds by the thread's CPU time, not the wall clock (shared machines)");
  cmd->callback([args] {
    RunBench(*args);
    SetExitCode(0);
  });
}

}  // namespace cortado::tools
