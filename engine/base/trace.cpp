#include "engine/base/trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/base/error.h"
#include "engine/base/file_io.h"

namespace cortado {
namespace {

const char* TrackName(TraceTrack track) {
  switch (track) {
    case TraceTrack::kCompute:
      return "compute";
    case TraceTrack::kGradients:
      return "gradients (all-reduce)";
    case TraceTrack::kBatchNorm:
      return "batchnorm (all-reduce)";
  }
  return "?";
}

}  // namespace

// Times count from the steady clock's epoch (on Linux, boot), which every process of one
// machine shares, so the traces of its ranks line up without any exchange.
Trace::Trace(int rank) : rank_(rank), origin_() {}

void Trace::Add(TraceTrack track, std::string name, const char* category, Clock::time_point begin,
                Clock::time_point end, Args args) {
  const double b = std::chrono::duration<double, std::micro>(begin - origin_).count();
  const double d = std::chrono::duration<double, std::micro>(end - begin).count();
  events_.push_back(Event{track, std::move(name), category, b, d < 0 ? 0 : d, std::move(args)});
}

void Trace::Write(const std::string& path) const {
  using nlohmann::json;
  json events = json::array();
  // Metadata: the process is the rank, the threads are the tracks (sorted in track order).
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", rank_},
                    {"tid", 0},
                    {"args", {{"name", StrCat("rank ", rank_)}}}});
  events.push_back({{"ph", "M"},
                    {"name", "process_sort_index"},
                    {"pid", rank_},
                    {"tid", 0},
                    {"args", {{"sort_index", rank_}}}});
  for (TraceTrack t : {TraceTrack::kCompute, TraceTrack::kGradients, TraceTrack::kBatchNorm}) {
    const int tid = static_cast<int>(t);
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", rank_},
                      {"tid", tid},
                      {"args", {{"name", TrackName(t)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", rank_},
                      {"tid", tid},
                      {"args", {{"sort_index", tid}}}});
  }
  for (const Event& e : events_) {
    json event = {{"ph", "X"},
                  {"name", e.name},
                  {"cat", e.category},
                  {"pid", rank_},
                  {"tid", static_cast<int>(e.track)},
                  {"ts", e.begin_us},
                  {"dur", e.duration_us}};
    if (!e.args.empty()) {
      json args = json::object();
      for (const auto& [k, v] : e.args) args[k] = v;
      event["args"] = std::move(args);
    }
    events.push_back(std::move(event));
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};

  WriteFileAtomically(path,
                      doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void CheckTraceWritable(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  bool ok = std::ofstream(tmp, std::ios::trunc).good();
  fs::remove(tmp, ec);
  CORTADO_CHECK(ok, "--trace: cannot write trace file '", path,
                "' (does its folder exist and allow writing?)");
}

std::string TracePathForRank(const std::string& path, int rank, int world_size) {
  if (world_size <= 1) return path;
  namespace fs = std::filesystem;
  fs::path p(path);
  std::string stem = p.stem().string(), ext = p.extension().string();
  return (p.parent_path() / (stem + ".rank" + std::to_string(rank) + ext)).string();
}

}  // namespace cortado
