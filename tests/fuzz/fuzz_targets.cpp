#include "tests/fuzz/fuzz_targets.h"

#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "data/record_decoder.h"
#include "engine/checkpoint.h"
#include "engine/error.h"
#include "engine/net.h"
#include "engine/safetensors.h"
#include "engine/yaml_config.h"
#include "models/builders.h"
#include "tools/run_config.h"
#include "tools/weights.h"

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

// A checkpoint file as it is on disk (header, CRC, payload), and the same bytes as a payload
// behind a valid header, so that mutations get past the CRC into the record parser.
void CheckpointFile(const uint8_t* data, size_t size) {
  try {
    ParseCheckpoint(Text(data, size), "fuzz.cortado");
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
    ParseCheckpoint(file, "fuzz.cortado");
  } catch (const Error&) {
  }
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
    tools::LoadWeights(*net, "resnet18", file, "fuzz.safetensors", /*strict=*/false);
  } catch (const Error&) {
  }
}

const Target kTargets[] = {
    {"config", "YAML training config: YamlConfig + ParseRunConfig", Config},
    {"checkpoint", "checkpoint file and payload: ParseCheckpoint", CheckpointFile},
    {"record", "LMDB record: Datum parser, image decode, transforms (RecordDecoder)", Record},
    {"weights", "weights file: ParseSafetensors + LoadWeights into a ResNet-18", Weights},
    {nullptr, nullptr, nullptr},
};

}  // namespace

const Target* Targets() { return kTargets; }

}  // namespace cortado::fuzz
