// Caffe SSD's AnnotatedDatum records and label maps against the published field numbers, read
// and written by code that shares nothing with Cortado's: a wire-format reader
// (tests/data/wire_format.h) and Python's protobuf with classes protoc compiles from
// tests/data/caffe_ssd.proto (tests/data/caffe_ssd_records.py; skipped without protoc or
// python3-protobuf). Records written the way Caffe SSD's convert_annoset writes them read as
// they are.
#include "data/annotated_datum.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "data/label_map.h"
#include "engine/base/error.h"
#include "tests/data/test_images.h"
#include "tests/data/wire_format.h"

namespace cortado {
namespace {

using testing::ParseWire;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::WireField;
using testing::WriteFile;

std::map<int, std::vector<WireField>> ByNumber(std::string_view bytes) {
  std::map<int, std::vector<WireField>> out;
  for (WireField& f : ParseWire(bytes)) out[f.number].push_back(std::move(f));
  return out;
}

// The one occurrence of field `number` (throws, failing the test, when it is absent or repeated).
const WireField& Only(std::map<int, std::vector<WireField>>& fields, int number) {
  CORTADO_CHECK(fields[number].size() == 1, "field ", number, " occurs ", fields[number].size(),
                " times");
  return fields[number][0];
}

float FloatOf(const WireField& f) {
  EXPECT_EQ(f.wire_type, 5);
  const uint32_t bits = static_cast<uint32_t>(f.value);
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

std::vector<BoxAnnotation> SampleBoxes() {
  // Labels interleaved (12, 3, 12), as objects come in a VOC file: grouped by label on disk.
  return {BoxAnnotation{12, 0, 0.125f, 0.25f, 0.5f, 0.75f, false},
          BoxAnnotation{3, 0, 0.0f, 0.0f, 1.0f, 1.0f, true},
          BoxAnnotation{12, 1, 0.5f, 0.5f, 0.625f, 0.875f, false}};
}

TEST(AnnotatedDatum, SerializedWithCaffeSsdFieldNumbers) {
  DatumFields f;
  f.channels = 3;
  f.height = 375;
  f.width = 500;
  f.label = -1;
  f.encoded = true;
  const std::string record = SerializeAnnotatedDatum(f, "jpeg bytes", SampleBoxes());
  auto top = ByNumber(record);
  // AnnotatedDatum: datum = 1 (message), type = 2 (enum BBOX = 0), annotation_group = 3.
  ASSERT_EQ(top[1].size(), 1u);
  ASSERT_EQ(Only(top, 1).wire_type, 2);
  auto datum = ByNumber(Only(top, 1).bytes);
  EXPECT_EQ(Only(datum, 1).value, 3u);
  EXPECT_EQ(Only(datum, 2).value, 375u);
  EXPECT_EQ(Only(datum, 3).value, 500u);
  EXPECT_EQ(Only(datum, 4).bytes, "jpeg bytes");
  EXPECT_EQ(static_cast<int32_t>(Only(datum, 5).value), -1);
  EXPECT_EQ(Only(datum, 7).value, 1u);
  ASSERT_EQ(top[2].size(), 1u);
  EXPECT_EQ(Only(top, 2).wire_type, 0);
  EXPECT_EQ(Only(top, 2).value, 0u);
  // Two groups, in order of first appearance: label 12 with two objects, then label 3.
  ASSERT_EQ(top[3].size(), 2u);
  auto g12 = ByNumber(top[3][0].bytes), g3 = ByNumber(top[3][1].bytes);
  EXPECT_EQ(Only(g12, 1).value, 12u);  // group_label = 1
  EXPECT_EQ(Only(g3, 1).value, 3u);
  ASSERT_EQ(g12[2].size(), 2u);  // annotation = 2
  ASSERT_EQ(g3[2].size(), 1u);
  auto second = ByNumber(g12[2][1].bytes);
  EXPECT_EQ(Only(second, 1).value, 1u);         // instance_id = 1
  auto bbox = ByNumber(Only(second, 2).bytes);  // bbox = 2: xmin 1, ymin 2, xmax 3, ymax 4
  EXPECT_EQ(FloatOf(Only(bbox, 1)), 0.5f);
  EXPECT_EQ(FloatOf(Only(bbox, 2)), 0.5f);
  EXPECT_EQ(FloatOf(Only(bbox, 3)), 0.625f);
  EXPECT_EQ(FloatOf(Only(bbox, 4)), 0.875f);
  EXPECT_EQ(Only(bbox, 6).value, 0u);  // difficult = 6
  auto only = ByNumber(Only(g3, 2).bytes);
  auto difficult = ByNumber(Only(only, 2).bytes);
  EXPECT_EQ(Only(difficult, 6).value, 1u);
}

TEST(AnnotatedDatum, RoundTripsAndRefusesWhatIsNotOne) {
  DatumFields f;
  f.channels = 3;
  f.height = 4;
  f.width = 5;
  f.label = -1;
  f.encoded = true;
  AnnotatedDatumParser p;
  std::string why;
  const std::string record = SerializeAnnotatedDatum(f, "abc", SampleBoxes());
  ASSERT_TRUE(p.Parse(record.data(), record.size(), &why)) << why;
  EXPECT_EQ(p.fields().width, 5);
  EXPECT_EQ(p.fields().label, -1);
  EXPECT_EQ(p.data(), "abc");
  // Group by group: label 12's two objects, then label 3's.
  ASSERT_EQ(p.boxes().size(), 3u);
  EXPECT_EQ(p.boxes()[0].label, 12);
  EXPECT_EQ(p.boxes()[1].label, 12);
  EXPECT_EQ(p.boxes()[1].instance_id, 1);
  EXPECT_EQ(p.boxes()[1].xmax, 0.625f);
  EXPECT_EQ(p.boxes()[2].label, 3);
  EXPECT_TRUE(p.boxes()[2].difficult);
  // No boxes at all: an image without objects is a record too.
  const std::string empty = SerializeAnnotatedDatum(f, "abc", {});
  ASSERT_TRUE(p.Parse(empty.data(), empty.size(), &why)) << why;
  EXPECT_TRUE(p.boxes().empty());
  // A classification Datum is not one: its image is not where an AnnotatedDatum keeps it.
  const std::string datum = SerializeDatum(f, "abc");
  EXPECT_FALSE(p.Parse(datum.data(), datum.size(), &why));
  EXPECT_NE(why.find("classification Datum"), std::string::npos) << why;
  // Boxes that are not boxes.
  for (float bad : {std::nanf(""), 0.1f}) {
    std::vector<BoxAnnotation> boxes = {BoxAnnotation{1, 0, 0.2f, 0.2f, bad, 0.5f, false}};
    const std::string r = SerializeAnnotatedDatum(f, "abc", boxes);
    EXPECT_FALSE(p.Parse(r.data(), r.size(), &why));
    EXPECT_NE(why.find("is not a box"), std::string::npos) << why;
    EXPECT_TRUE(p.boxes().empty());
  }
  const std::string junk = "\x0a\xff\xff\xff\xff\x0f";
  EXPECT_FALSE(p.Parse(junk.data(), junk.size(), &why));
}

TEST(LabelMap, ParsesCaffeSsdFilesAndChecksThem) {
  // As Caffe SSD's data/VOC0712/labelmap_voc.prototxt begins (labels out of order here).
  const std::string text =
      "item {\n  name: \"none_of_the_above\"\n  label: 0\n  display_name: \"background\"\n}\n"
      "item {\n  name: \"bicycle\"\n  label: 2\n  display_name: \"bicycle\"\n}\n"
      "item {\n  name: \"aeroplane\"\n  label: 1\n  display_name: \"aeroplane\"\n}\n";
  const std::vector<LabelMapEntry> map = ParseLabelMap(text, "labelmap_voc.prototxt");
  ASSERT_EQ(map.size(), 3u);
  EXPECT_EQ(map[0].display_name, "background");
  EXPECT_EQ(map[1].name, "aeroplane");
  EXPECT_EQ(map[2].label, 2);
  // Without a background item, one is added; display_name defaults to the name.
  const auto no_bg = ParseLabelMap(
      "item { name: \"1\" label: 1 display_name: \"person\" }\n"
      "item { name: \"2\" label: 2 }\n",
      "coco");
  ASSERT_EQ(no_bg.size(), 3u);
  EXPECT_EQ(no_bg[0].label, 0);
  EXPECT_EQ(no_bg[1].display_name, "person");
  EXPECT_EQ(no_bg[2].display_name, "2");
  // What we write reads back the same.
  const auto again = ParseLabelMap(LabelMapText(map), "again");
  ASSERT_EQ(again.size(), map.size());
  for (size_t i = 0; i < map.size(); ++i) {
    EXPECT_EQ(again[i].name, map[i].name);
    EXPECT_EQ(again[i].label, map[i].label);
    EXPECT_EQ(again[i].display_name, map[i].display_name);
  }
  auto fails = [](const std::string& t, const std::string& want) {
    try {
      ParseLabelMap(t, "lm.prototxt");
      ADD_FAILURE() << "accepted: " << t;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  fails("item { name: \"a\" label: 1 }\nitem { name: \"a\" label: 2 }", "name 'a' is listed twice");
  fails("item { name: \"a\" label: 1 }\nitem { name: \"b\" label: 1 }", "label 1 is listed twice");
  fails("item { name: \"a\" label: 1 }\nitem { name: \"b\" label: 3 }", "label 2 is missing");
  fails("item { name: \"a\" label: -1 }", "has label -1");
  fails("item { name: \"a\" }", "has no label");
  fails("", "names no classes");
  fails("item {\n  name: \"a\"\n  lable: 1\n}\n", "lm.prototxt:3:");
}

// Python's protobuf, from the published definitions, compiled by protoc at test time.
class CaffeSsdPython : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v protoc >/dev/null 2>&1") != 0 ||
        std::system("/usr/bin/python3 -c 'import google.protobuf' >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "protoc or python3-protobuf is not installed";
    }
    const std::string src = std::string(CORTADO_SOURCE_DIR) + "/tests/data";
    const std::string cmd = "protoc --proto_path=" + src + " --python_out=" + dir_.path() + " " +
                            src + "/caffe_ssd.proto";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  // Runs caffe_ssd_records.py with `args`; its stdout.
  std::string Python(const std::string& args) {
    const std::string script = std::string(CORTADO_SOURCE_DIR) + "/tests/data/caffe_ssd_records.py";
    const std::string out = dir_ / "stdout.txt";
    const std::string cmd =
        "PYTHONPATH=" + dir_.path() + " /usr/bin/python3 " + script + " " + args + " > " + out;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return ReadFileBytes(out);
  }

  TempDir dir_;
};

TEST_F(CaffeSsdPython, TheirRecordsReadAsTheyAre) {
  // An encoded JPEG record and a raw BGR one, with boxes of two classes, one difficult.
  const ImageU8 image = testing::MakeImage(20, 10, 3, 1);
  WriteFile(dir_ / "image.jpg", testing::EncodeJpeg(image));
  std::string planes(3 * 10 * 20, '\0');  // Caffe's raw layout: BGR planes
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 200; ++i)
      planes[c * 200 + i] = static_cast<char>(image.pixels[i * 3 + 2 - c]);
  }
  WriteFile(dir_ / "planes.raw", planes);
  nlohmann::json boxes = nlohmann::json::array();
  boxes.push_back({{"label", 7},
                   {"xmin", 0.1},
                   {"ymin", 0.2},
                   {"xmax", 0.3},
                   {"ymax", 0.4},
                   {"difficult", false}});
  boxes.push_back({{"label", 2},
                   {"xmin", 0.0},
                   {"ymin", 0.5},
                   {"xmax", 1.0},
                   {"ymax", 1.0},
                   {"difficult", true}});
  boxes.push_back({{"label", 7},
                   {"xmin", 0.6},
                   {"ymin", 0.1},
                   {"xmax", 0.9},
                   {"ymax", 0.8},
                   {"difficult", false}});
  nlohmann::json spec = nlohmann::json::array();
  spec.push_back({{"image", dir_ / "image.jpg"},
                  {"channels", 3},
                  {"height", 10},
                  {"width", 20},
                  {"encoded", true},
                  {"boxes", boxes}});
  spec.push_back({{"image", dir_ / "planes.raw"},
                  {"channels", 3},
                  {"height", 10},
                  {"width", 20},
                  {"encoded", false},
                  {"boxes", nlohmann::json::array()}});
  WriteFile(dir_ / "spec.json", spec.dump());
  Python("write " + (dir_ / "spec.json") + " " + dir_.path());

  AnnotatedDatumParser p;
  std::string why;
  const std::string jpeg_record = ReadFileBytes(dir_ / "0.bin");
  ASSERT_TRUE(p.Parse(jpeg_record.data(), jpeg_record.size(), &why)) << why;
  EXPECT_TRUE(p.fields().encoded);
  EXPECT_EQ(p.fields().label, -1);
  EXPECT_EQ(p.fields().width, 20);
  EXPECT_EQ(p.data(), ReadFileBytes(dir_ / "image.jpg"));
  // Grouped by Python as convert_annoset groups: label 7 (two objects), then label 2.
  ASSERT_EQ(p.boxes().size(), 3u);
  const BoxAnnotation& a = p.boxes()[0];
  const BoxAnnotation& b = p.boxes()[1];
  const BoxAnnotation& c = p.boxes()[2];
  EXPECT_EQ(a.label, 7);
  EXPECT_EQ(a.instance_id, 0);
  EXPECT_FLOAT_EQ(a.xmin, 0.1f);
  EXPECT_FLOAT_EQ(a.ymax, 0.4f);
  EXPECT_EQ(b.label, 7);
  EXPECT_EQ(b.instance_id, 1);
  EXPECT_FLOAT_EQ(b.xmin, 0.6f);
  EXPECT_EQ(c.label, 2);
  EXPECT_EQ(c.instance_id, 0);
  EXPECT_TRUE(c.difficult);
  EXPECT_FALSE(a.difficult);

  const std::string raw_record = ReadFileBytes(dir_ / "1.bin");
  ASSERT_TRUE(p.Parse(raw_record.data(), raw_record.size(), &why)) << why;
  EXPECT_FALSE(p.fields().encoded);
  EXPECT_TRUE(p.boxes().empty());
  ImageU8 pixels;
  ASSERT_TRUE(p.RawPixels(&pixels, &why)) << why;
  ASSERT_EQ(pixels.width, 20);
  ASSERT_EQ(pixels.channels, 3);
  EXPECT_TRUE(std::equal(image.pixels.begin(), image.pixels.begin() + 600, pixels.pixels.begin()));
}

TEST_F(CaffeSsdPython, OurRecordsAndLabelMapsReadInPython) {
  DatumFields f;
  f.channels = 3;
  f.height = 7;
  f.width = 9;
  f.label = -1;
  f.encoded = true;
  WriteFile(dir_ / "ours.bin",
            SerializeAnnotatedDatum(f, std::string("\x00\x01z", 3), SampleBoxes()));
  const nlohmann::json j = nlohmann::json::parse(Python("read " + (dir_ / "ours.bin")));
  EXPECT_EQ(j["channels"], 3);
  EXPECT_EQ(j["height"], 7);
  EXPECT_EQ(j["width"], 9);
  EXPECT_EQ(j["label"], -1);
  EXPECT_EQ(j["encoded"], true);
  EXPECT_EQ(j["data"], "00017a");
  EXPECT_EQ(j["has_type"], true);
  EXPECT_EQ(j["type"], 0);
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][0]["label"], 12);
  EXPECT_EQ(j["groups"][1]["label"], 3);
  const nlohmann::json second = j["groups"][0]["annotations"][1];
  EXPECT_EQ(second[0], 1);
  EXPECT_EQ(second[1], 0.5);
  EXPECT_EQ(second[3], 0.625);
  EXPECT_EQ(second[4], 0.875);
  EXPECT_EQ(j["groups"][1]["annotations"][0][5], true);

  WriteFile(dir_ / "labelmap.prototxt", LabelMapText(MakeLabelMap({"cat", "dog"}, {"Cat", "Dog"})));
  const nlohmann::json m =
      nlohmann::json::parse(Python("labelmap " + (dir_ / "labelmap.prototxt")));
  EXPECT_EQ(m.dump(), R"([["none_of_the_above",0,"background"],["cat",1,"Cat"],["dog",2,"Dog"]])");
}

}  // namespace
}  // namespace cortado
