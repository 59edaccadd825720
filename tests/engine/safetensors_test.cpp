#include "engine/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "engine/base/error.h"
#include "tests/support/errors.h"

namespace cortado {
namespace {

using testing::ErrorOf;

// A file from a header text and data bytes, as another writer would lay it out.
std::string Raw(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

TEST(Safetensors, RoundTripsTensorsRawEntriesAndMetadata) {
  Safetensors file;
  file.metadata["format"] = "pt";
  Tensor w({2, 3}, DType::kF32);
  for (int i = 0; i < 6; ++i) w.data<float>()[i] = 0.5f * i - 1;
  Tensor h({3}, DType::kF16);
  for (int i = 0; i < 3; ++i) h.data<Half>()[i] = FloatToHalf(0.25f * i);
  file.Add("conv1.weight", w);
  file.Add("half", h);
  SafetensorsEntry counter;
  counter.name = "bn1.num_batches_tracked";
  counter.dtype = "I64";
  counter.bytes.assign(8, '\0');
  file.AddRaw(counter);
  Tensor empty({0, 4}, DType::kF32);
  file.Add("empty", empty);

  const std::string bytes = SerializeSafetensors(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data starts 8-byte aligned";
  const Safetensors back = ParseSafetensors(bytes, "mem");
  EXPECT_EQ(back.metadata.at("format"), "pt");
  ASSERT_EQ(back.entries.size(), 4u);
  EXPECT_EQ(back.entries[0].name, "conv1.weight");  // data order is the order added
  const Tensor w2 = back.Find("conv1.weight")->ToTensor();
  EXPECT_EQ(w2.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(w2.raw_data(), w.raw_data(), w.nbytes()), 0);
  EXPECT_EQ(back.Find("half")->ToTensor().dtype(), DType::kF16);
  EXPECT_EQ(back.Find("bn1.num_batches_tracked")->dtype, "I64");
  EXPECT_TRUE(back.Find("bn1.num_batches_tracked")->shape.empty());
  EXPECT_NE(ErrorOf([&] { back.Find("bn1.num_batches_tracked")->ToTensor(); }).find("I64"),
            std::string::npos);
  EXPECT_EQ(back.Find("empty")->ToTensor().numel(), 0);
  EXPECT_EQ(back.Find("missing"), nullptr);
  EXPECT_NE(ErrorOf([&] { file.Add("half", h); }).find("added twice"), std::string::npos);

  const std::string path =
      (std::filesystem::temp_directory_path() / ("st_" + std::to_string(getpid()))).string();
  SaveSafetensors(file, path);
  EXPECT_EQ(LoadSafetensors(path).entries.size(), 4u);
  EXPECT_FALSE(
      std::filesystem::exists(std::filesystem::path(path).parent_path() /
                              ("." + std::filesystem::path(path).filename().string() + ".tmp")));
  std::filesystem::remove(path);
  EXPECT_NE(ErrorOf([&] { LoadSafetensors(path); }).find("does not exist"), std::string::npos);
}

TEST(Safetensors, DamagedFilesAreRefusedNamingFileAndTensor) {
  const std::string four(4, 'x');
  struct Case {
    std::string bytes, want;
  };
  const Case cases[] = {
      {"abc", "fewer than the 8"},
      {Raw("{}", "").substr(0, 8) + "{", "claims 2 bytes"},
      {Raw("{not json", ""), "is not JSON"},
      {Raw("[1,2]", ""), "not a JSON object"},
      {Raw(R"({"a":{"dtype":"F32","shape":[1]}})", four), "'a' lacks"},
      {Raw(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", four), "unknown dtype 'Q7'"},
      {Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four), "4 bytes for 2"},
      {Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", four), "outside the 4"},
      {Raw(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four), "not a size"},
      {Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
           four),
       "overlap"},
      {Raw(R"({"__metadata__":{"k":1}})", ""), "'k' is not a string"},
      {Raw(R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,4]}})", four),
       "too large"},
      // Counts whose size in bytes wraps to 0 in 64 bits: 2^61 F64 values, 2^62 F32 values.
      {Raw(R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", ""),
       "too large"},
      {Raw(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""),
       "too large"},
      // A dimension beyond int64 behind a zero one (0 values, but no shape a tensor can take).
      {Raw(R"({"a":{"dtype":"F32","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", ""),
       "too large"},
  };
  for (const Case& c : cases) {
    const std::string e = ErrorOf([&] { ParseSafetensors(c.bytes, "m.safetensors"); });
    EXPECT_NE(e.find("'m.safetensors' is not a valid safetensors file"), std::string::npos) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace cortado
