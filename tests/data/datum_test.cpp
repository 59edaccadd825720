// Datum records against caffe.proto's field numbers, read by code that shares nothing with the
// converter: a wire-format reader (tests/data/wire_format.h) and, where Debian's
// python3-protobuf is installed, Python's protobuf with a Datum descriptor built by hand.
#include "data/datum.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "tests/data/test_images.h"
#include "tests/data/wire_format.h"

namespace cortado {
namespace {

using testing::CaffeRawDatum;
using testing::ParseWire;
using testing::PutFloatField;
using testing::PutVarintField;
using testing::TempDir;
using testing::WireField;

TEST(Datum, SerializedWithCaffeFieldNumbers) {
  DatumFields f;
  f.channels = 3;
  f.height = 375;
  f.width = 500;
  f.label = 917;
  f.encoded = true;
  const std::string payload = "\xff\xd8\xff jpeg bytes";
  const std::vector<WireField> fields = ParseWire(SerializeDatum(f, payload));
  std::map<int, WireField> by_number;
  for (const WireField& w : fields) {
    EXPECT_TRUE(by_number.emplace(w.number, w).second) << "field " << w.number << " twice";
  }
  // caffe.proto: channels = 1, height = 2, width = 3, data = 4, label = 5, encoded = 7.
  ASSERT_EQ(by_number.size(), 6u);
  EXPECT_EQ(by_number[1].wire_type, 0);
  EXPECT_EQ(by_number[1].value, 3u);
  EXPECT_EQ(by_number[2].value, 375u);
  EXPECT_EQ(by_number[3].value, 500u);
  EXPECT_EQ(by_number[4].wire_type, 2);
  EXPECT_EQ(by_number[4].bytes, payload);
  EXPECT_EQ(by_number[5].wire_type, 0);
  EXPECT_EQ(by_number[5].value, 917u);
  EXPECT_EQ(by_number[7].wire_type, 0);
  EXPECT_EQ(by_number[7].value, 1u);
}

TEST(Datum, ParsesCaffeRawRecords) {
  // 2x3 pixels, BGR planes as Caffe stores them.
  const int h = 2, w = 3;
  std::string chw(3 * h * w, '\0');
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < h * w; ++i) chw[c * h * w + i] = static_cast<char>(10 * c + i);
  }
  DatumParser p;
  const std::string record = CaffeRawDatum(3, h, w, chw, 4);
  ASSERT_TRUE(p.Parse(record.data(), record.size()));
  EXPECT_FALSE(p.fields().encoded);  // absent field 7: Caffe's default
  EXPECT_EQ(p.fields().label, 4);
  ImageU8 img;
  std::string why;
  ASSERT_TRUE(p.RawPixels(&img, &why)) << why;
  EXPECT_EQ(img.channels, 3);
  for (int i = 0; i < h * w; ++i) {
    EXPECT_EQ(img.pixels[i * 3 + 0], 20 + i) << "R comes from Caffe's third (R) plane";
    EXPECT_EQ(img.pixels[i * 3 + 1], 10 + i);
    EXPECT_EQ(img.pixels[i * 3 + 2], 0 + i);
  }
  // float_data (field 6, unpacked as proto2 writes it), grey.
  std::string floats;
  PutVarintField(1, 1, &floats);
  PutVarintField(2, 1, &floats);
  PutVarintField(3, 2, &floats);
  PutFloatField(6, 12.4f, &floats);
  PutFloatField(6, 300.0f, &floats);
  PutVarintField(5, 1, &floats);
  ASSERT_TRUE(p.Parse(floats.data(), floats.size()));
  ASSERT_TRUE(p.RawPixels(&img, &why)) << why;
  EXPECT_EQ(img.pixels[0], 12);
  EXPECT_EQ(img.pixels[1], 255);
  // Sizes that do not add up are refused, not read out of bounds.
  const std::string bad = CaffeRawDatum(3, 10, 10, "short", 0);
  ASSERT_TRUE(p.Parse(bad.data(), bad.size()));
  EXPECT_FALSE(p.RawPixels(&img, &why));
  EXPECT_NE(why.find("holds"), std::string::npos);
  const std::string junk = "\x0a\xff\xff\xff\xff\x0f";  // a length far past the end
  EXPECT_FALSE(p.Parse(junk.data(), junk.size()));
}

// Python's protobuf (the reference implementation, not our generated code) reads a record
// through a descriptor built from caffe.proto's field numbers.
TEST(Datum, PythonProtobufReadsOurRecords) {
  if (std::system("/usr/bin/python3 -c 'import google.protobuf' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-protobuf is not installed";
  }
  TempDir dir;
  DatumFields f;
  f.channels = 1;
  f.height = 7;
  f.width = 9;
  f.label = 123456;
  f.encoded = true;
  testing::WriteFile(dir / "record.bin", SerializeDatum(f, std::string("\x00\x01\x02zz", 5)));
  const std::string script = std::string(CORTADO_SOURCE_DIR) + "/tests/data/read_datum.py";
  const std::string cmd =
      "/usr/bin/python3 " + script + " " + (dir / "record.bin") + " > " + (dir / "out.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(testing::ReadFileBytes(dir / "out.txt"),
            "channels=1 height=7 width=9 label=123456 encoded=True data=0001027a7a floats=0\n");
}

}  // namespace
}  // namespace cortado
