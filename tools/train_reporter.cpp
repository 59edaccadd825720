#include "tools/train_reporter.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "engine/base/cpu_isa.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/gemm_lowp.h"
#include "tools/command_line.h"
#include "tools/trainer.h"

namespace cortado {
namespace {

double Seconds(TrainReporter::Clock::time_point a, TrainReporter::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string Bytes(double bytes) {
  return bytes < 1048576.0 ? Fixed(bytes / 1024.0, 0) + " KB" : Fixed(bytes / 1048576.0, 1) + " MB";
}

TrainReporter::Clock::duration Duration(double seconds) {
  return std::chrono::duration_cast<TrainReporter::Clock::duration>(
      std::chrono::duration<double>(seconds));
}

// The precision line: what runs in 16 bits, and how the loss is scaled.
std::string PrecisionLine(DType compute, const LossScaler* scaler) {
  const bool bf16 = compute == DType::kBF16;
  const bool native = bf16 && BF16GemmPath() == LowpGemmPath::kNative;
  return StrCat(bf16 ? "bf16" : "fp16",
                " activations, f32 master weights; convolution and inner-product products ",
                native ? "in native bf16 (oneDNN, AVX512_BF16)"
                : bf16
                    ? (NativeBF16GemmAvailable() ? "widened to f32 (CORTADO_GEMM_BF16=widened)"
                                                 : "widened to f32 (this CPU has no AVX512_BF16)")
                    : "widened to f32 (no native f16 GEMM on CPUs)",
                "; loss scale ",
                scaler ? (scaler->options().dynamic ? StrCat("dynamic from ", scaler->scale())
                                                    : StrCat(scaler->scale()))
                       : std::string("none"));
}

// Where 16-bit compute is slower than fp32: the CPU has no 16-bit dot product for it (f16
// never does on CPUs; bf16 without AVX512_BF16), so every convolution and product widens its
// operands to f32 and runs the f32 kernels, and the conversions come on top.
std::string SlowLowPrecisionLine(DType compute) {
  const char* name = compute == DType::kBF16 ? "bf16" : "fp16";
  return StrCat("this CPU has no ", name, " dot product (",
                compute == DType::kBF16 ? "AVX512_BF16" : "no CPU has one",
                "): every convolution and product widens its operands to f32, so ", name,
                " computes slower than fp32 here; it still halves the activations' memory. For "
                "speed use precision.compute: fp32");
}

}  // namespace

TrainReporter::TrainReporter(Trainer& trainer) : trainer_(trainer) {}
TrainReporter::~TrainReporter() = default;

bool TrainReporter::is_root() const { return trainer_.world().rank == 0; }

void TrainReporter::Open(const TrainOptions& options) {
  first_iteration_ = trainer_.iteration();
  if (is_root()) {
    progress_ = ProgressBar(options.progress_bar);
    // A continued run appends; a fresh one has an empty file or was told to start over.
    metrics_.Open(options.metrics_path, !options.resume.empty());
    WriteStartEvent(options);
  }
  if (!options.trace_path.empty()) {
    const World& world = trainer_.world();
    trace_ = std::make_unique<Trace>(world.rank);
    trace_path_ = TracePathForRank(options.trace_path, world.rank, world.size);
    CheckTraceWritable(trace_path_);  // a bad --trace path stops before training, not after
    trace_until_ =
        options.trace_iters > 0 ? trainer_.iteration() + options.trace_iters : trainer_.max_iter();
    trainer_.AttachTrace(trace_.get());
  }
  Banner();
  interval_.Reset();
}

// Marks where a run (or a resumed part of it) begins, so plots and readers can tell the parts
// apart and check that they belong to one config.
void TrainReporter::WriteStartEvent(const TrainOptions& options) {
  nlohmann::ordered_json m;
  m["event"] = trainer_.iteration() > 0 ? "resume" : "start";
  m["iter"] = trainer_.iteration();
  m["epoch"] = static_cast<double>(trainer_.iteration()) / trainer_.batches_per_epoch();
  const char* launch = std::getenv("CORTADO_LAUNCH_COMMAND");
  m["command"] = (launch != nullptr && *launch != '\0' ? std::string(launch) + " " : "") +
                 tools::ShellJoin(options.argv);
  m["config_hash"] = ConfigHash(trainer_.config().resolved_yaml);
  m["ranks"] = trainer_.world().size;
  metrics_.Write(m);
}

void TrainReporter::Banner() const {
  const Trainer& t = trainer_;
  const RunConfig& config = t.config();
  const int ranks = t.world().size;
  const int64_t samples = t.train_source().samples_per_epoch();
  // With several ranks every count of the data is this rank's; the job's is W times it.
  LogInfo("model: ", trainer_.net().num_parameters(), " parameters; data: ", samples,
          " training samples",
          ranks > 1 ? StrCat(" per rank (", samples * ranks, " in all)") : std::string(), ", ",
          t.batches_per_epoch(), " batches of ", config.data.batch_size,
          ranks > 1 ? " per rank" : "", " per epoch; ", NumThreads(), " thread(s)",
          ranks > 1 ? " per rank" : "");
  LogInfo("cpu: ", CpuDescription());
  // "layout: ..." and "convolutions: ..." (the net's memory format, reorders, kernels).
  const std::string layout = LayoutSummary(config, trainer_.net());
  for (size_t at = 0; at < layout.size();) {
    const size_t end = layout.find('\n', at);
    LogInfo(layout.substr(at, end - at));
    at = end == std::string::npos ? layout.size() : end + 1;
  }
  if (IsLowPrecision(config.precision.compute)) {
    LogInfo("precision: ", PrecisionLine(config.precision.compute, t.loss_scaler()));
    if (config.precision.compute == DType::kF16 || !NativeBF16GemmAvailable()) {
      LogWarning(SlowLowPrecisionLine(config.precision.compute));
    }
  }
  // The learning rate goes with the global batch: say both, on one rank too (a recipe's rate
  // is for its global batch).
  const std::string batch_and_lr =
      StrCat("global batch ", t.global_batch(), " (", ranks, " x ", config.data.batch_size,
             "), learning rate ", config.solver.schedule.base_lr,
             " (solver.base_lr, not scaled with the global batch)");
  if (t.data_parallel() == nullptr) {
    LogInfo("one rank: ", batch_and_lr);
  } else {
    LogInfo("data-parallel: ", ranks, " ranks (", t.world().backend, "), ", batch_and_lr);
    BannerDataParallel();
  }
  LogInfo("training to iteration ", t.max_iter(), " (",
          Fixed(static_cast<double>(t.max_iter()) / t.batches_per_epoch(), 2),
          " epochs); checkpoints in '", config.checkpoint.dir, "'");
}

void TrainReporter::BannerDataParallel() const {
  const DataParallel& dp = *trainer_.data_parallel();
  const SyncBatchNormReducer* sync_bn = trainer_.sync_batch_norm();
  const auto& buckets = dp.buckets();
  std::string sizes;
  for (const auto& b : buckets) {
    if (!sizes.empty()) sizes += " + ";
    sizes += Bytes(static_cast<double>(b.end - b.begin) *
                   static_cast<double>(DTypeSize(dp.gradient_block().dtype())));
  }
  // Each codec once, in bucket order (compared as names: "f16" is part of "bf16").
  std::vector<dist::CodecKind> kinds;
  std::string codecs;
  for (const auto& b : buckets) {
    if (std::find(kinds.begin(), kinds.end(), b.codec) == kinds.end()) {
      kinds.push_back(b.codec);
      codecs += StrCat(codecs.empty() ? "" : ", ", dist::CodecName(b.codec));
    }
  }
  if (dp.options().auto_codec.enabled) {
    codecs =
        dp.codec_plans() > 0
            ? StrCat("; codecs auto, as planned before the checkpoint: ", codecs)
            : StrCat("; codecs auto (", dist::CodecName(dp.options().auto_codec.candidates.front()),
                     " for the first ", dp.options().auto_codec.warmup_steps,
                     " step(s), then as planned)");
  } else if (codecs != "f32") {
    codecs = StrCat("; codecs ", codecs, " (", dist::RoundingName(dp.options().rounding),
                    dp.options().error_feedback ? ", error feedback" : "",
                    "): ", Bytes(dp.wire_bytes_per_step()), " sent per step instead of ",
                    Bytes(dp.f32_bytes_per_step()));
  } else {
    codecs = StrCat("; ", Bytes(dp.wire_bytes_per_step()), " sent per step");
  }
  LogInfo("gradients: ", buckets.size(), " bucket(s) of ", sizes, codecs, ", overlap ",
          dp.options().overlap ? "on" : "off", ", all-reduce ", dp.bucket_algorithms(),
          "; batch norm: ",
          sync_bn ? (trainer_.config().distributed.sync_bn
                         ? StrCat("synchronized over groups of ", sync_bn->group_size())
                         : std::string("per rank (sync_bn: false)"))
                  : std::string("per rank"));
}

void TrainReporter::Step(const StepTimes& times) {
  const Trainer& t = trainer_;
  interval_.Add(t.last_loss(), times);
  const bool last = t.iteration() == t.max_iter();
  if (t.iteration() % t.config().log_interval == 0 || last) {
    // Corrupt training records replaced so far, summed over the ranks (collective).
    double replaced = static_cast<double>(t.train_source().stats().skipped_records);
    if (t.world().comm && t.world().size > 1) {
      t.world().comm->AllReduce(&replaced, 1, dist::DataType::kF64, dist::ReduceOp::kSum);
    }
    if (is_root()) LogInterval(static_cast<int64_t>(replaced));
    interval_.Reset();
  }
  if (is_root()) progress_.Update(t.iteration(), t.max_iter(), first_iteration_, t.last_loss());
}

void TrainReporter::LogInterval(int64_t replaced_records) {
  const Trainer& t = trainer_;
  const DataParallel* dp = t.data_parallel();
  const LossScaler* scaler = t.loss_scaler();
  const IntervalStats& s = interval_;
  const double seconds = s.Seconds();
  const double steps = static_cast<double>(s.steps);
  const double images = steps * static_cast<double>(t.global_batch());
  const double img_per_s = images / std::max(seconds, 1e-9);
  const double epoch = static_cast<double>(t.iteration()) / t.batches_per_epoch();
  const double eta = static_cast<double>(t.max_iter() - t.iteration()) * seconds / steps;
  const double loss = s.loss_sum / steps;
  progress_.Clear();
  std::string comm;
  if (dp) {
    comm = StrCat(", comm wait ", Fixed(1000 * s.time.comm_wait / steps, 1));
    if (s.time.sync_bn > 0) {
      comm += StrCat(" (+ sync BN ", Fixed(1000 * s.time.sync_bn / steps, 1), " in compute)");
    }
    // CPU time, not wall time: what the buckets cost the communicator's thread.
    comm += StrCat(", comm CPU ", Fixed(1000 * s.time.comm_cpu / steps, 1));
  }
  std::string scaling;
  if (scaler) {
    scaling = StrCat("  scale ", scaler->scale());
    if (scaler->skipped_steps() > 0) scaling += StrCat(" (", scaler->skipped_steps(), " skipped)");
  }
  // Training replaces a corrupt record by the next one (data/lmdb_source.h): say how often.
  const std::string replaced = replaced_records > 0
                                   ? StrCat("  (", replaced_records, " corrupt record(s) replaced)")
                                   : std::string();
  LogInfo("train iter ", t.iteration(), "/", t.max_iter(), "  epoch ", Fixed(epoch, 2), "  loss ",
          Fixed(loss, 4), "  lr ", t.last_lr(), scaling, "  ",
          Fixed(img_per_s, img_per_s < 100 ? 1 : 0), " img/s  ms/step: compute ",
          Fixed(1000 * s.time.compute / steps, 1), comm, ", data ",
          Fixed(1000 * s.time.data_wait / steps, 1), "  ETA ", FormatDuration(eta), replaced);
  nlohmann::ordered_json m;
  m["event"] = "train";
  m["iter"] = t.iteration();
  m["epoch"] = epoch;
  m["loss"] = loss;
  m["lr"] = t.last_lr();
  m["img_per_s"] = img_per_s;
  m["data_wait_s"] = s.time.data_wait;
  m["compute_s"] = s.time.compute;
  m["comm_wait_s"] = s.time.comm_wait;
  m["sync_bn_s"] = s.time.sync_bn;
  m["replaced_records"] = replaced_records;
  if (dp) {
    m["wire_bytes_per_step"] = dp->wire_bytes_per_step();
    m["comm_cpu_s"] = s.time.comm_cpu;
    m["comm_user_s"] = s.time.comm_user;
    m["comm_system_s"] = s.time.comm_system;
    m["comm_wakeups"] = s.time.comm_wakeups;
    if (dp->options().auto_codec.enabled) {
      m["codec_plan"] = dp->codec_plan();
      m["codec_plans"] = dp->codec_plans();
    }
  }
  if (scaler) {
    m["loss_scale"] = scaler->scale();
    m["skipped_steps"] = scaler->skipped_steps();
  }
  metrics_.Write(m);
}

void TrainReporter::Eval(const EvalResult& r, double seconds) {
  if (!is_root()) return;
  const double epoch = static_cast<double>(trainer_.iteration()) / trainer_.batches_per_epoch();
  progress_.Clear();
  const std::string figures =
      r.detection
          ? StrCat("mAP@0.5 ", Fixed(r.map50 * 100, 2), "%  mAP ", Fixed(r.map * 100, 2), "%")
          : StrCat("top1 ", Fixed(r.top1 * 100, 2), "%  top5 ", Fixed(r.top5 * 100, 2), "%");
  LogInfo("eval  iter ", trainer_.iteration(), "  epoch ", Fixed(epoch, 2), "  ", figures,
          "  loss ", Fixed(r.loss, 4), "  (", r.images, " images, ",
          r.skipped > 0 ? StrCat(r.skipped, " unreadable record(s) skipped, ") : std::string(),
          Fixed(seconds, 1), " s)");
  nlohmann::ordered_json m;
  m["event"] = "eval";
  m["iter"] = trainer_.iteration();
  m["epoch"] = epoch;
  if (r.detection) {
    // JSON has no NaN: a pass without any box that counts has no mAP.
    m["map50"] = std::isnan(r.map50) ? nlohmann::ordered_json() : nlohmann::ordered_json(r.map50);
    m["map"] = std::isnan(r.map) ? nlohmann::ordered_json() : nlohmann::ordered_json(r.map);
  } else {
    m["top1"] = r.top1;
    m["top5"] = r.top5;
  }
  m["loss"] = r.loss;
  m["images"] = r.images;
  m["skipped"] = r.skipped;
  metrics_.Write(m);
}

void TrainReporter::Saved(const std::string& path) {
  if (!is_root()) return;
  progress_.Clear();
  LogInfo("checkpoint saved to '", path, "'");
}

void TrainReporter::Overflow(int64_t iteration, double loss, double scale, double new_scale) {
  if (!is_root()) return;
  progress_.Clear();
  LogInfo("iteration ", iteration, ": ", std::isfinite(loss) ? "gradients" : "the loss",
          " overflowed at loss scale ", scale, "; step skipped, scale now ", new_scale);
}

void TrainReporter::Stopped(const std::string& what, const std::string& path,
                            const std::vector<std::string>& argv) {
  if (!is_root()) return;
  progress_.Clear();
  const World& world = trainer_.world();
  if (trainer_.iteration() == trainer_.max_iter()) {
    // Training is complete and saved; only an evaluation was left.
    LogWarning(what, "; all ", trainer_.max_iter(), " iterations are saved in '", path,
               "'. Evaluate it with: cortado eval --checkpoint ", tools::ShellQuote(path));
    return;
  }
  std::string resume = tools::ResumeCommand(argv);
  if (argv.empty()) {
    resume = StrCat("cortado train --config ", tools::ShellQuote(trainer_.config().file),
                    " --resume auto");
  } else if (world.size > 1 && std::getenv("CORTADO_LAUNCH_COMMAND") == nullptr) {
    resume = StrCat("rerun the job's launcher (mpirun, srun, torchrun) with: ", resume);
  } else if (world.size > world.local_size) {
    resume += " (on every node)";
  }
  LogWarning(what, "; checkpoint saved to '", path, "'. Resume with: ", resume);
}

void TrainReporter::Finish(Clock::time_point run_start) {
  progress_.Clear();
  const SourceStats stats = trainer_.train_source().stats();
  if (is_root() && stats.loader_threads > 0) {
    // The decode threads come on top of the compute budget (README, Threads): say what they
    // cost, so a loader that competes with compute shows.
    const double wall = Seconds(run_start, Clock::now());
    LogInfo("data loader: ", stats.loader_threads, " decode thread(s) used ",
            Fixed(stats.loader_cpu_seconds, 1), " CPU-s in ", Fixed(wall, 1), " s (",
            Fixed(100 * stats.loader_cpu_seconds / std::max(wall, 1e-9), 1),
            "% of one core) beside ", NumThreads(), " compute thread(s); training waited ",
            Fixed(stats.wait_seconds, 1), " s for data");
  }
  if (stats.skipped_records > 0) {
    LogWarning(stats.skipped_records, " corrupt record(s) were skipped during training");
  }
}

void TrainReporter::TraceStep(const StepTimes& times, Clock::time_point t0,
                              Clock::time_point t_update0, Clock::time_point t_update1) {
  Trace& trace = *trace_;
  const double it = static_cast<double>(trainer_.iteration());
  trace.Add(TraceTrack::kCompute, "data wait", "data", t0, t0 + Duration(times.data_wait),
            {{"iteration", it}});
  for (const Net::LayerTime& l : trainer_.net().layer_times()) {
    trace.Add(TraceTrack::kCompute, l.name, "forward", l.forward_start,
              l.forward_start + Duration(l.forward_s));
    if (l.backward_s > 0 && l.backward_start >= l.forward_start) {
      trace.Add(TraceTrack::kCompute, l.name, "backward", l.backward_start,
                l.backward_start + Duration(l.backward_s));
    }
  }
  trace.Add(TraceTrack::kCompute, "update", "solver", t_update0, t_update1, {{"iteration", it}});
}

void TrainReporter::FinishTrace() {
  if (!trace_) return;
  trainer_.AttachTrace(nullptr);
  // Losing the trace (disk full) is no reason to stop training.
  try {
    trace_->Write(trace_path_);
    LogInfo("trace of iterations ", first_iteration_, "-", trainer_.iteration() - 1,
            " written to '", trace_path_, "' (", trace_->size(),
            " events; open in Perfetto or chrome://tracing)");
  } catch (const Error& e) {
    LogWarning("no trace: ", e.what());
  }
  trace_.reset();
}

}  // namespace cortado
