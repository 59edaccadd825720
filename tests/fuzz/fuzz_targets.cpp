#include "tests/fuzz/fuzz_targets.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bootstrap/store_wire.h"
#include "cortado/dist/error.h"
#include "data/detection_sets.h"
#include "data/idx_source.h"
#include "data/label_map.h"
#include "data/record_decoder.h"
#include "engine/base/error.h"
#include "engine/base/log.h"
#include "engine/graph/loss_scaler.h"
#include "engine/graph/net.h"
#include "engine/graph/solver.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/yaml_config.h"
#include "engine/parallel/data_parallel.h"
#include "models/builders.h"
#include "tools/run_config.h"
#include "tools/weights.h"
#include "transport/tcp/frames.h"

namespace cortado::fuzz {
namespace {

std::string Text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A training config: YAML syntax, the strict key checks and every section's validation.
void Config(const uint8_t* data, size_t size) {
  try {
    YamlConfig yaml = YamlConfig::FromString(Text(data, size), "fuzz.yaml");
    ParseRunConfig(yaml, /*need_train=*/false);
  } catch (const Error&) {
  }
}

// What a checkpoint is resumed into: a net of two fully connected layers (4 -> 3 -> 2) with
// SGD momentum, a dynamic loss scale, and DataParallel on one rank under distributed.codec: auto
// with error feedback (a fixed link: one rank cannot measure one). Built once; a DataParallel and
// a loss scaler are made per input.
struct ResumeState {
  std::unique_ptr<dist::Communicator> comm = dist::CreateCommunicator(dist::CommConfig{});
  Net net{Spec(), 1};
  SgdSolver solver{net.params(), SgdOptions{}};

  static NetSpec Spec() {
    NetSpec spec;
    spec.name = "fuzz";
    spec.inputs = {{"data", {2, 4}, DType::kF32}, {"label", {2}, DType::kI32}};
    for (const auto& [name, from, outputs] :
         {std::tuple<const char*, const char*, int>{"fc1", "data", 3}, {"fc2", "fc1", 2}}) {
      LayerSpec fc{name, "InnerProduct", {from}, {name}, {}, ""};
      fc.settings.Set("num_output", outputs);
      spec.layers.push_back(fc);
    }
    spec.layers.push_back(LayerSpec{"loss", "SoftmaxWithLoss", {"fc2", "label"}, {"loss"}, {}, ""});
    return spec;
  }
  static DataParallelOptions Options() {
    DataParallelOptions o;
    o.bucket_mb = o.first_bucket_mb = o.last_bucket_mb = 1e-5;
    o.discardable_steps = true;
    o.auto_codec.enabled = true;
    o.auto_codec.warmup_steps = 1;
    o.auto_codec.interval = 1;
    o.auto_codec.link_override = {{0, 1e4}};
    return o;
  }
  ResumeState() {
    SetLogLevel(LogLevel::kError);  // a plan's lines for every input would drown the findings
    CodecPolicy policy;
    policy.codec = "auto";
    ApplyCodecPolicy(net, policy);
  }
};

ResumeState& Resume() {
  static ResumeState* state = new ResumeState();  // never destroyed: no order at exit
  return *state;
}

// Steps of the resumed run: the first after a resume, and a check (interval 1).
void TwoSteps(ResumeState& s, DataParallel& dp) {
  for (int64_t step = 0; step < 2; ++step) {
    dp.BeginStep(step);
    dp.SetControl(s.net.Forward(), false);
    s.net.Backward();
    dp.FinishStep();
  }
}

// Every part loads its own state from the checkpoint, as a resumed run does, then two steps run
// from it: an entry that passed its part's checks must not break the steps.
void ResumeFrom(const Checkpoint& ckpt) {
  ResumeState& s = Resume();
  DataParallel dp(s.net, *s.comm, ResumeState::Options());
  LossScaler scaler(LossScalerOptions{});
  s.net.LoadState(ckpt, "fuzz.cortado");
  s.solver.LoadState(ckpt, "fuzz.cortado");
  scaler.LoadState(ckpt, "fuzz.cortado");
  dp.LoadState(ckpt, "fuzz.cortado");
  TwoSteps(s, dp);
}

// A checkpoint file as it is on disk (header, CRC, payload), and the same bytes as a payload
// behind a valid header, so that mutations get past the CRC into the record parser; what parses
// is resumed from (ResumeFrom), so that mutations reach every part's checks of its entries.
void CheckpointFile(const uint8_t* data, size_t size) {
  try {
    ResumeFrom(ParseCheckpoint(Text(data, size), "fuzz.cortado"));
  } catch (const Error&) {
  }
  std::string file("CRTDCKPT", 8);
  const uint32_t version = kCheckpointVersion;
  const uint32_t crc = static_cast<uint32_t>(crc32_z(0L, data, size));
  const uint64_t length = size;
  file.append(reinterpret_cast<const char*>(&version), 4);
  file.append(reinterpret_cast<const char*>(&crc), 4);
  file.append(reinterpret_cast<const char*>(&length), 8);
  file.append(reinterpret_cast<const char*>(data), size);
  try {
    ResumeFrom(ParseCheckpoint(file, "fuzz.cortado"));
  } catch (const Error&) {
  }
}

// The payload of a checkpoint (what CheckpointFile puts behind a valid header).
std::string Payload(const Checkpoint& ckpt) {
  constexpr size_t kHeader = 8 + 4 + 4 + 8;
  return SerializeCheckpoint(ckpt).substr(kHeader);
}

// Seeds of the checkpoint target: a whole resumable state after a plan, as a payload, and that
// state with each entry that a crafted file once got past the checks with (issue 40).
std::vector<std::pair<std::string, std::string>> CheckpointSeeds() {
  ResumeState& s = Resume();
  Checkpoint ckpt;
  {
    DataParallel dp(s.net, *s.comm, ResumeState::Options());
    TwoSteps(s, dp);
    dp.GatherForCheckpoint();
    s.net.SaveState(ckpt);
    s.solver.SaveState(ckpt);
    LossScaler(LossScalerOptions{}).SaveState(ckpt);
    dp.SaveState(ckpt);
    for (auto& [name, t] : ckpt.tensors) t = t.Clone();
  }
  std::vector<std::pair<std::string, std::string>> seeds = {{"resume.bin", Payload(ckpt)}};
  const auto crafted = [&](const std::string& name, const std::function<void(Checkpoint&)>& f) {
    Checkpoint c = ckpt;
    for (auto& [n, t] : c.tensors) t = t.Clone();
    f(c);
    seeds.emplace_back(name, Payload(c));
  };
  const auto floor = [](double value) {
    return [=](Checkpoint& c) {
      for (auto& [name, t] : c.tensors) {
        // [latency, rate, backward end, ready per bucket, floor per bucket, measured per bucket]
        if (name == "codec_auto/measurements") t.data<double>()[3 + (t.numel() - 3) / 3] = value;
      }
    };
  };
  crafted("regress-error-feedback-ranks-0.bin",
          [](Checkpoint& c) { c.meta["error_feedback_ranks"] = "0"; });
  crafted("regress-codec-auto-plans-not-a-number.bin",
          [](Checkpoint& c) { c.meta["codec_auto_plans"] = "one"; });
  crafted("regress-codec-auto-floor-negative.bin", floor(-1));
  crafted("regress-codec-auto-floor-nan.bin", floor(NAN));
  return seeds;
}

// A database record as the LMDB loader decodes it: Datum, then JPEG (or another format
// through OpenCV) or raw pixels, then the training and the validation transform.
void Record(const uint8_t* data, size_t size) {
  TransformOptions options;
  options.crop = 16;
  options.val_resize = 20;
  static RecordDecoder decoder(options);  // reused across inputs, as a loader thread does
  std::vector<float> image(3 * 16 * 16);
  int32_t label = 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    decoder.Decode(bytes, /*train=*/true, size, image.data(), &label);
    decoder.Decode(bytes, /*train=*/false, 0, image.data(), &label);
  } catch (const Error&) {
  }
}

// A detection record as the detection loader decodes it: AnnotatedDatum, image, SSD's
// augmentation and the evaluation resize. Rows that come out must be whole, normalized boxes.
void DetectionRecord(const uint8_t* data, size_t size) {
  DetectionTransformOptions options;
  options.size = 16;
  static DetectionDecoder decoder(options);  // reused across inputs, as a loader thread does
  std::vector<float> image(3 * 16 * 16), rows;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool train : {true, false}) {
    try {
      if (!decoder.Decode(bytes, train, size, image.data(), &rows)) continue;
    } catch (const Error&) {
      continue;
    }
    bool ok = rows.size() % kBoxRowWidth == 0;
    for (size_t r = 0; ok && train && r < rows.size(); r += kBoxRowWidth) {
      const float* b = &rows[r + 2];  // xmin ymin xmax ymax
      ok = b[0] >= 0 && b[1] >= 0 && b[2] <= 1 && b[3] <= 1 && b[2] > b[0] && b[3] > b[1];
    }
    if (!ok) {
      std::fprintf(stderr, "detection record gave %zu floats of rows, not whole boxes in [0, 1]\n",
                   rows.size());
      std::abort();
    }
  }
}

// An annotation as `cortado convert` reads one: a Pascal VOC XML file, and the same bytes as a
// Caffe SSD label map (protobuf text format).
void Annotation(const uint8_t* data, size_t size) {
  const std::string text = Text(data, size);
  DetectionItem item;
  std::string why;
  try {
    if (ParseVocAnnotation(text, &item, &why)) {
      for (const PixelBox& b : item.boxes) {
        if (!(b.xmax >= b.xmin && b.ymax >= b.ymin) || b.name.empty()) {
          std::fprintf(stderr, "VOC annotation accepted with a box that is not one\n");
          std::abort();
        }
      }
    }
  } catch (const Error&) {
  }
  try {
    ParseLabelMap(text, "fuzz.prototxt");
  } catch (const Error&) {
  }
}

// An IDX images file followed by its labels file (split at the first labels magic after the
// images header), as ReadIdxDataset parses them once decompressed. A pair it accepts must hold
// count x height x width pixels and count labels; the last pixel is read, so that a size that
// wrapped shows under ASan as well.
void Idx(const uint8_t* data, size_t size) {
  static const uint8_t kLabelsMagic[] = {0, 0, 8, 1};
  const uint8_t* end = data + size;
  const uint8_t* split =
      size > 16 ? std::search(data + 16, end, std::begin(kLabelsMagic), std::end(kLabelsMagic))
                : end;
  const std::vector<uint8_t> images(data, split), labels(split, end);
  try {
    const IdxDataset d =
        ParseIdxDataset(images, labels, "fuzz-images-idx3-ubyte", "fuzz-labels-idx1-ubyte");
    uint64_t pixels = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(d.count), static_cast<uint64_t>(d.height),
                               &pixels) ||
        __builtin_mul_overflow(pixels, static_cast<uint64_t>(d.width), &pixels) ||
        d.pixels.size() != pixels || d.labels.size() != static_cast<uint64_t>(d.count)) {
      std::fprintf(stderr,
                   "IDX pair accepted with %zu pixels and %zu labels for %lld x %lld x %lld\n",
                   d.pixels.size(), d.labels.size(), static_cast<long long>(d.count),
                   static_cast<long long>(d.height), static_cast<long long>(d.width));
      std::abort();
    }
    volatile uint8_t last = d.pixels.empty() ? 0 : d.pixels[static_cast<size_t>(pixels) - 1];
    (void)last;
  } catch (const Error&) {
  }
}

// An accepted safetensors entry must hold exactly its shape's bytes, counted without wrapping.
void CheckEntrySize(const SafetensorsEntry& e) {
  uint64_t bytes = SafetensorsDTypeSize(e.dtype);
  bool wrapped = false;
  for (int64_t d : e.shape) {
    wrapped |= d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
  }
  if (wrapped || bytes != e.bytes.size()) {
    std::fprintf(stderr, "safetensors entry '%s' accepted with %zu bytes for its shape\n",
                 e.name.c_str(), e.bytes.size());
    std::abort();
  }
}

// A weights file (safetensors) loaded into a ResNet-18 of width 1, as `cortado train
// --weights` loads one: header and entries checked, tensors converted, shapes compared.
void Weights(const uint8_t* data, size_t size) {
  static Net* net = [] {
    ModelOptions o;
    o.num_classes = 2;
    o.in_channels = 3;
    o.height = o.width = 16;
    o.base_width = 1;
    return new Net(BuildModel("resnet18", o), 1);
  }();
  try {
    const Safetensors file = ParseSafetensors(Text(data, size), "fuzz.safetensors");
    for (const SafetensorsEntry& e : file.entries) CheckEntrySize(e);
    tools::LoadWeights(*net, "resnet18", file, "fuzz.safetensors", /*strict=*/false);
  } catch (const Error&) {
  }
}

// What the TCP transport does with a peer's bytes (distributed/src/frames.h): the handshake
// frame, and a hello in it checked against this rank's identity; then the frames of an open
// connection, each header checked before its payload is touched, abort and status payloads
// parsed.
void Frames(const uint8_t* data, size_t size) {
  namespace di = dist::internal;
  const std::string in = Text(data, size);
  di::HelloPayload mine{};
  mine.token_digest = 0x1234;
  mine.fingerprint = 0x5678;
  size_t pos = 0;
  try {
    di::FrameHeader h;
    std::string payload;
    if (di::ParseHandshakeFrame(in, &h, &payload)) {
      if (h.type == di::kFrameHello && payload.size() == sizeof(di::HelloPayload)) {
        di::HelloPayload hello;
        std::memcpy(&hello, payload.data(), sizeof(hello));
        di::HelloRejection(hello, mine, 1, 3, /*connected=*/false);
      }
      pos = sizeof(di::FrameHeader) + payload.size();
    }
  } catch (const dist::Error&) {
  }
  while (pos + sizeof(di::FrameHeader) <= in.size()) {
    di::FrameHeader h;
    std::memcpy(&h, in.data() + pos, sizeof(h));
    pos += sizeof(h);
    if (!di::FrameHeaderProblem(h).empty()) break;  // the connection fails here
    const size_t len = static_cast<size_t>(std::min<uint64_t>(h.length, in.size() - pos));
    try {
      if (h.type == di::kFrameAbort) di::ParseAbortPayload(in.data() + pos, len);
      if (h.type == di::kFrameStatusReply) di::ParseStatusPayload(in.data() + pos, len);
    } catch (const dist::Error&) {
    }
    pos += len;
  }
}

// What the TCP store's server does with a client's bytes (distributed/src/store_wire.h): the
// hello checked against the job's identity, then length-prefixed requests; every request
// that parses must serialize back to the bytes it came from.
void Store(const uint8_t* data, size_t size) {
  namespace di = dist::internal;
  const std::string in = Text(data, size);
  const dist::JobIdentity identity{"job", 3, 0x5678};
  try {
    di::CheckStoreHello(di::ParseStoreHello(in.data(), in.size()), identity);
  } catch (const dist::Error&) {
  }
  size_t pos = std::min(in.size(), di::kStoreHelloBytes);
  while (pos + 4 <= in.size()) {
    uint32_t len = 0;
    std::memcpy(&len, in.data() + pos, 4);
    pos += 4;
    if (len > di::kMaxStoreMessage) break;  // the server drops the client here
    const std::string body = in.substr(pos, len);
    try {
      const di::StoreRequest request = di::ParseStoreRequest(body);
      const std::string again = di::SerializeStoreRequest(request);
      // Trailing bytes after the number are ignored by the parser, so compare the prefix.
      if (again.compare(4, std::string::npos, body, 0, again.size() - 4) != 0) {
        std::fprintf(stderr, "store request does not serialize back to its bytes\n");
        std::abort();
      }
    } catch (const dist::Error&) {
    }
    try {
      di::ParseStoreReply(body, "fuzz reply");
    } catch (const dist::Error&) {
    }
    pos += body.size();
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> GeneratedSeeds(const std::string& target) {
  if (target == "checkpoint") return CheckpointSeeds();
  return {};
}

namespace {

const Target kTargets[] = {
    {"config", "YAML training config: YamlConfig + ParseRunConfig", Config},
    {"checkpoint", "checkpoint file and payload: ParseCheckpoint, then resumed from",
     CheckpointFile},
    {"record", "LMDB record: Datum parser, image decode, transforms (RecordDecoder)", Record},
    {"detection_record",
     "detection LMDB record: AnnotatedDatum, image decode, SSD augmentation (DetectionDecoder)",
     DetectionRecord},
    {"annotation", "Pascal VOC annotation XML and Caffe SSD label map text", Annotation},
    {"weights", "weights file: ParseSafetensors + LoadWeights into a ResNet-18", Weights},
    {"idx", "IDX images and labels files (MNIST's format): ParseIdxDataset", Idx},
    {"frames", "TCP transport frames: handshake, hello check, header checks, control payloads",
     Frames},
    {"store", "TCP store messages: hello check, requests (round trip), replies", Store},
    {nullptr, nullptr, nullptr},
};

}  // namespace

const Target* Targets() { return kTargets; }

}  // namespace cortado::fuzz
