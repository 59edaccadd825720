// `cortado bench data --db DB [--threads N] [--batch-size B] [--crop C] [--seconds S]
//                     [--val] [--json]`
// Decode + augment throughput of the LMDB loader: the training transform (RandomResizedCrop,
// flip, normalize to float32 CHW) or with --val the validation one, on N loader threads, as
// images/s seen by a consumer that does nothing else. scripts/bench/data.sh compares it with
// PIL + torchvision on the same JPEGs.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "data/data_options.h"
#include "data/lmdb_source.h"
#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace cortado::tools {

namespace {

struct BenchDataArgs {
  std::string db;
  int threads = 0, prefetch = 4;
  int64_t batch_size = 64, crop = 224, warmup = 3;
  double seconds = 10;
  bool val = false, json = false;
};

// Times the loader on the database for the requested seconds and prints the rate.
void RunBenchData(const BenchDataArgs& args) {
  CheckInputDir("--db", args.db, "an LMDB folder (from cortado convert)");
  if (args.threads > 0) SetNumThreads(args.threads);
  DataOptions options;
  options.type = "lmdb";
  options.train = options.val = args.db;
  options.batch_size = options.val_batch_size = args.batch_size;
  options.threads = NumThreads();
  options.prefetch = args.prefetch;
  options.crop = args.crop;
  options.val_resize = std::max<int64_t>(args.crop * 256 / 224, args.crop);
  options.flip = true;
  options.drop_last = false;  // a database smaller than one batch still benchmarks
  std::unique_ptr<BatchSource> source = args.val ? MakeLmdbEvalSource(options, ShardSpec{})
                                                 : MakeLmdbTrainSource(options, ShardSpec{}, 1);
  Batch batch;
  // The validation source makes one pass: start it again at the end.
  auto next = [&] {
    if (source->Next(batch)) return batch.size;
    source->Start(0, 0);
    CORTADO_CHECK(source->Next(batch), "LMDB ", args.db, " yields no batch");
    return batch.size;
  };
  source->Start(0, 0);
  for (int64_t i = 0; i < args.warmup; ++i) next();
  int64_t images = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  while (seconds < args.seconds) {
    images += next();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double rate = images / seconds;
  const int threads = NumThreads();
  const SourceStats stats = source->stats();
  if (args.json) {
    nlohmann::ordered_json j;
    j["db"] = args.db;
    j["transform"] = args.val ? "val" : "train";
    j["threads"] = threads;
    j["batch_size"] = args.batch_size;
    j["crop"] = args.crop;
    j["images"] = images;
    j["seconds"] = seconds;
    j["images_per_s"] = rate;
    j["images_per_s_per_thread"] = rate / threads;
    j["skipped_records"] = stats.skipped_records;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf(
        "%s transform, %d thread(s), batch %lld, crop %lld: %.1f images/s "
        "(%.1f per thread, %lld images in %.1f s)\n",
        args.val ? "val" : "train", threads, static_cast<long long>(args.batch_size),
        static_cast<long long>(args.crop), rate, rate / threads, static_cast<long long>(images),
        seconds);
  }
  SetExitCode(0);
}

}  // namespace

void AddBenchDataCommand(CLI::App& bench) {
  auto args = std::make_shared<BenchDataArgs>();
  CLI::App* cmd =
      bench.add_subcommand("data", "Data loader throughput (decode + augment images/s)");
  cmd->add_option("--db", args->db, "LMDB database (from cortado convert)")->required();
  cmd->add_option("--threads", args->threads, "Loader threads (0: the thread budget)")
      ->check(IntAtLeast(0, "0: the thread budget"));
  cmd->add_option("--batch-size", args->batch_size, "Batch size")->check(IntAtLeast(1));
  cmd->add_option("--crop", args->crop, "Output side")->check(IntAtLeast(1));
  cmd->add_option("--prefetch", args->prefetch, "Batches decoded ahead")->check(IntAtLeast(1));
  cmd->add_option("--seconds", args->seconds, "Measured time")->check(NumberAbove(0));
  cmd->add_option("--warmup", args->warmup, "Batches before timing")->check(IntAtLeast(0));
  cmd->add_flag("--val", args->val, "Validation transform (resize + centre crop) instead");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] { RunBenchData(*args); });
}

}  // namespace cortado::tools
