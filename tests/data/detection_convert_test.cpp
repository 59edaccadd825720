// `cortado convert` on detection sets made here: Pascal VOC roots (JPEGImages, Annotations XML,
// ImageSets/Main lists; two roots joined as VOC07+12) and a COCO instances file, into Caffe SSD
// AnnotatedDatum records with a label map. Boxes are checked against the pixel coordinates they
// came from; bad input (malformed XML, a box outside the image, an unknown class, a missing or
// corrupt image, a size that disagrees) is skipped and named, never fatal.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "data/annotated_datum.h"
#include "data/converter.h"
#include "data/detection_sets.h"
#include "data/label_map.h"
#include "data/lmdb.h"
#include "tests/data/test_images.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;
using testing::EncodeJpeg;
using testing::MakeImage;
using testing::ReadFileBytes;
using testing::SplitLines;
using testing::TempDir;
using testing::WriteFile;

struct Obj {
  std::string name;
  std::string xmin, ymin, xmax, ymax;  // as written in the XML (VOC: 1-based, inclusive)
  bool difficult = false;
};

std::string VocXml(int width, int height, const std::vector<Obj>& objects) {
  std::string xml =
      StrCat("<annotation>\n  <folder>VOC</folder>\n  <size>\n    <width>", width,
             "</width>\n    <height>", height, "</height>\n    <depth>3</depth>\n  </size>\n");
  for (const Obj& o : objects) {
    xml += StrCat("  <object>\n    <name>", o.name, "</name>\n    <pose>Left</pose>\n",
                  "    <truncated>0</truncated>\n    <difficult>", o.difficult ? 1 : 0,
                  "</difficult>\n    <bndbox>\n      <xmin>", o.xmin, "</xmin>\n      <ymin>",
                  o.ymin, "</ymin>\n      <xmax>", o.xmax, "</xmax>\n      <ymax>", o.ymax,
                  "</ymax>\n    </bndbox>\n  </object>\n");
  }
  return xml + "</annotation>\n";
}

// A VOC root: each image id with its size and objects, and the split lists.
void AddVocImage(const std::string& root, const std::string& id, int w, int h,
                 const std::vector<Obj>& objects, int seed) {
  WriteFile(root + "/JPEGImages/" + id + ".jpg", EncodeJpeg(MakeImage(w, h, 3, seed)));
  WriteFile(root + "/Annotations/" + id + ".xml", VocXml(w, h, objects));
}

std::vector<std::pair<std::string, std::string>> ReadAll(const std::string& db) {
  LmdbReader reader(db);
  auto txn = reader.BeginRead();
  std::vector<std::pair<std::string, std::string>> out;
  for (int64_t i = 0; i < reader.size(); ++i) {
    out.emplace_back(std::string(reader.key(i)), std::string(txn.Get(i)));
  }
  return out;
}

std::vector<BoxAnnotation> BoxesOf(const std::string& record) {
  AnnotatedDatumParser p;
  std::string why;
  EXPECT_TRUE(p.Parse(record.data(), record.size(), &why)) << why;
  return p.boxes();
}

class DetectionConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // VOC2007: two images of two classes; 002 has a difficult object and one touching every edge.
    voc07_ = dir_ / "VOCdevkit/VOC2007";
    AddVocImage(voc07_, "001", 40, 30, {{"dog", "5", "6", "20", "25"}}, 1);
    AddVocImage(voc07_, "002", 50, 20,
                {{"cat", "1", "1", "50", "20"},
                 {"dog", "11", "2", "30", "12", true},
                 {"cat", "3", "4", "8", "9"}},
                2);
    WriteFile(voc07_ + "/ImageSets/Main/trainval.txt", "001\n002\n");
    WriteFile(voc07_ + "/ImageSets/Main/test.txt", "002\n");
    WriteFile(voc07_ + "/ImageSets/Main/cat_trainval.txt", "001 -1\n002  1\n");
    // VOC2012: one image, a class VOC2007 lacks.
    voc12_ = dir_ / "VOCdevkit/VOC2012";
    AddVocImage(voc12_, "2012_000001", 32, 32, {{"bird", "2", "2", "16", "16"}}, 3);
    WriteFile(voc12_ + "/ImageSets/Main/trainval.txt", "2012_000001\n");
  }

  ConvertOptions Voc(const std::string& out) const {
    ConvertOptions o;
    o.root = voc07_;
    o.split = "trainval";
    o.out = dir_ / out;
    o.threads = 2;
    return o;
  }

  TempDir dir_;
  std::string voc07_, voc12_;
};

TEST_F(DetectionConvertTest, VocRecordsHoldNormalizedBoxesGroupedByClass) {
  const ConvertSummary s = ConvertImages(Voc("db"));
  EXPECT_TRUE(s.detection);
  EXPECT_EQ(s.items, 2);
  EXPECT_EQ(s.converted, 2);
  EXPECT_EQ(s.skipped, 0);
  EXPECT_EQ(s.classes, 3);  // background, cat, dog
  EXPECT_EQ(s.boxes, 4);
  EXPECT_EQ(s.clipped_boxes, 0);
  const std::string db = dir_ / "db";
  EXPECT_EQ(ReadFileBytes(db + "/classes.txt"), "background\ncat\ndog\n");
  const std::vector<LabelMapEntry> map = ReadLabelMap(db + "/labelmap.prototxt");
  ASSERT_EQ(map.size(), 3u);
  EXPECT_EQ(map[0].name, "none_of_the_above");
  EXPECT_EQ(map[1].name, "cat");
  EXPECT_EQ(map[2].name, "dog");
  const std::optional<LmdbCompletion> done = ReadLmdbCompletion(db);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->task, "detection");
  EXPECT_EQ(done->records, 2);
  EXPECT_EQ(done->classes, 3);

  const auto records = ReadAll(db);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].first, "00000000_VOC2007/JPEGImages/001.jpg");
  EXPECT_EQ(records[1].first, "00000001_VOC2007/JPEGImages/002.jpg");
  AnnotatedDatumParser p;
  std::string why;
  ASSERT_TRUE(p.Parse(records[1].second.data(), records[1].second.size(), &why)) << why;
  EXPECT_EQ(p.fields().label, -1);
  EXPECT_EQ(p.fields().width, 50);
  EXPECT_EQ(p.fields().height, 20);
  EXPECT_TRUE(p.fields().encoded);
  EXPECT_TRUE(p.data() == ReadFileBytes(voc07_ + "/JPEGImages/002.jpg")) << "stored as it is";
  // Groups in order of first appearance (cat, dog); cat's two objects numbered 0 and 1.
  // VOC's 1-based inclusive (xmin, xmax) is [xmin - 1, xmax] of the width.
  const std::vector<BoxAnnotation>& b = p.boxes();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].label, 1);
  EXPECT_EQ(b[0].instance_id, 0);
  EXPECT_FLOAT_EQ(b[0].xmin, 0.0f);  // the whole image
  EXPECT_FLOAT_EQ(b[0].ymin, 0.0f);
  EXPECT_FLOAT_EQ(b[0].xmax, 1.0f);
  EXPECT_FLOAT_EQ(b[0].ymax, 1.0f);
  EXPECT_EQ(b[1].label, 1);
  EXPECT_EQ(b[1].instance_id, 1);
  EXPECT_FLOAT_EQ(b[1].xmin, 2.0f / 50);
  EXPECT_FLOAT_EQ(b[1].ymin, 3.0f / 20);
  EXPECT_FLOAT_EQ(b[1].xmax, 8.0f / 50);
  EXPECT_FLOAT_EQ(b[1].ymax, 9.0f / 20);
  EXPECT_FALSE(b[1].difficult);
  EXPECT_EQ(b[2].label, 2);
  EXPECT_EQ(b[2].instance_id, 0);
  EXPECT_TRUE(b[2].difficult);
  EXPECT_FLOAT_EQ(b[2].xmin, 10.0f / 50);
  EXPECT_FLOAT_EQ(b[2].xmax, 30.0f / 50);

  // A resize re-encodes the image; normalized boxes do not change.
  ConvertOptions resized = Voc("db_resized");
  resized.resize_width = 64;
  resized.resize_height = 48;
  ConvertImages(resized);
  const auto again = ReadAll(dir_ / "db_resized");
  ASSERT_TRUE(p.Parse(again[1].second.data(), again[1].second.size(), &why)) << why;
  EXPECT_EQ(p.fields().width, 64);
  EXPECT_EQ(p.fields().height, 48);
  ASSERT_EQ(p.boxes().size(), 3u);
  EXPECT_FLOAT_EQ(p.boxes()[1].xmax, 8.0f / 50);
}

TEST_F(DetectionConvertTest, RootsJoinAsVoc0712AndALabelMapNumbersTheTestSet) {
  ConvertOptions o = Voc("trainval0712");
  o.extra_roots = {voc12_};
  const ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(s.converted, 3);
  EXPECT_EQ(s.classes, 4);  // bird, cat, dog: sorted over both roots
  const std::string train = dir_ / "trainval0712";
  EXPECT_EQ(ReadFileBytes(train + "/classes.txt"), "background\nbird\ncat\ndog\n");
  const auto records = ReadAll(train);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].first, "00000002_VOC2012/JPEGImages/2012_000001.jpg");
  EXPECT_EQ(BoxesOf(records[2].second)[0].label, 1);  // bird
  EXPECT_EQ(BoxesOf(records[0].second)[0].label, 3);  // dog

  // The test split alone would number cat 1 and dog 2; the training label map keeps 2 and 3.
  ConvertOptions test = Voc("test07");
  test.split = "test";
  test.label_map = train + "/labelmap.prototxt";
  ConvertImages(test);
  EXPECT_EQ(ReadFileBytes(dir_ / "test07/classes.txt"), "background\nbird\ncat\ndog\n");
  const auto test_records = ReadAll(dir_ / "test07");
  ASSERT_EQ(test_records.size(), 1u);
  const std::vector<BoxAnnotation> b = BoxesOf(test_records[0].second);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].label, 2);
  EXPECT_EQ(b[2].label, 3);

  // A class outside the label map skips its image, named.
  WriteFile(dir_ / "cats.prototxt", "item { name: \"cat\" label: 1 }\n");
  ConvertOptions only_cats = Voc("only_cats");
  only_cats.label_map = dir_ / "cats.prototxt";
  const ConvertSummary c = ConvertImages(only_cats);
  EXPECT_EQ(c.converted, 0);
  EXPECT_EQ(c.skipped, 2);
  const std::string skipped = ReadFileBytes(dir_ / "only_cats/skipped.txt");
  EXPECT_NE(skipped.find("VOC2007/JPEGImages/001.jpg\t" + voc07_ +
                         "/Annotations/001.xml: object 1 is of class 'dog', which is not in the "
                         "label map " +
                         (dir_ / "cats.prototxt")),
            std::string::npos)
      << skipped;
}

TEST_F(DetectionConvertTest, BadInputIsSkippedAndNamed) {
  const std::string root = dir_ / "bad/VOC";
  std::string list;
  auto add = [&](const std::string& id, int w, int h, const std::vector<Obj>& objects) {
    AddVocImage(root, id, w, h, objects, static_cast<int>(list.size()));
    list += id + "\n";
  };
  add("good", 40, 30, {{"dog", "1", "1", "10", "10"}});
  add("clipped", 40, 30, {{"dog", "-4", "1", "45", "10"}});  // partly outside: clipped
  add("outside", 40, 30, {{"dog", "1", "1", "10", "10"}, {"dog", "50", "1", "60", "10"}});
  add("reversed", 40, 30, {{"dog", "20", "1", "10", "10"}});
  add("not_a_number", 40, 30, {{"zebra", "1", "1", "9", "9"}, {"dog", "1", "1", "ten", "10"}});
  add("no_image", 40, 30, {{"dog", "1", "1", "10", "10"}});
  fs::remove(root + "/JPEGImages/no_image.jpg");
  add("no_xml", 40, 30, {});
  fs::remove(root + "/Annotations/no_xml.xml");
  add("broken_xml", 40, 30, {{"dog", "1", "1", "10", "10"}});
  WriteFile(root + "/Annotations/broken_xml.xml", "<annotation><object><name>dog</name>");
  add("corrupt_jpeg", 40, 30, {{"dog", "1", "1", "10", "10"}});
  WriteFile(root + "/JPEGImages/corrupt_jpeg.jpg",
            EncodeJpeg(MakeImage(40, 30, 3, 9)).substr(0, 50));
  add("wrong_size", 40, 30, {{"dog", "1", "1", "10", "10"}});
  WriteFile(root + "/JPEGImages/wrong_size.jpg", EncodeJpeg(MakeImage(80, 60, 3, 9)));
  add("no_objects", 40, 30, {});  // an image without objects is a record
  WriteFile(root + "/ImageSets/Main/trainval.txt", list);

  ConvertOptions o;
  o.root = root;
  o.split = "trainval";
  o.out = dir_ / "bad_db";
  const ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(s.items, 11);
  EXPECT_EQ(s.converted, 3);
  EXPECT_EQ(s.skipped, 8);
  EXPECT_EQ(s.boxes, 2);
  EXPECT_EQ(s.clipped_boxes, 1);
  // The skipped file's zebra is no class.
  EXPECT_EQ(ReadFileBytes(o.out + "/classes.txt"), "background\ndog\n");
  const auto records = ReadAll(o.out);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[1].first, "00000001_VOC/JPEGImages/clipped.jpg");
  const std::vector<BoxAnnotation> clipped = BoxesOf(records[1].second);
  ASSERT_EQ(clipped.size(), 1u);
  EXPECT_FLOAT_EQ(clipped[0].xmin, 0.0f);
  EXPECT_FLOAT_EQ(clipped[0].xmax, 1.0f);
  EXPECT_EQ(records[2].first, "00000010_VOC/JPEGImages/no_objects.jpg");
  EXPECT_TRUE(BoxesOf(records[2].second).empty());

  const std::vector<std::string> lines = SplitLines(ReadFileBytes(o.out + "/skipped.txt"));
  ASSERT_EQ(lines.size(), 8u);
  const std::string ann = root + "/Annotations/";
  const std::vector<std::pair<std::string, std::string>> want = {
      {"outside", ann + "outside.xml: object 2 (dog) box (49, 0) - (60, 10) has no area inside "
                        "the 40x30 image"},
      {"reversed", "malformed annotation " + ann +
                       "reversed.xml: object 1 (dog): box (20, 1) - (10, 10) has xmax < xmin or "
                       "ymax < ymin"},
      {"not_a_number", "malformed annotation " + ann +
                           "not_a_number.xml: object 2 (dog): <xmax> is 'ten', not a "
                           "number"},
      {"no_image", "cannot open"},
      {"no_xml", "cannot read its annotation " + ann + "no_xml.xml"},
      {"broken_xml", "malformed annotation " + ann + "broken_xml.xml: malformed XML (line 1"},
      {"corrupt_jpeg", "corrupt JPEG"},
      {"wrong_size", ann + "wrong_size.xml states a 40x30 image, but the image is 80x60"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(lines[i].rfind("VOC/JPEGImages/" + want[i].first + ".jpg\t" + want[i].second, 0), 0u)
        << lines[i];
  }
}

TEST_F(DetectionConvertTest, CocoInstancesFile) {
  const std::string images = dir_ / "coco/val2017";
  WriteFile(images + "/000000000009.jpg", EncodeJpeg(MakeImage(64, 48, 3, 1)));
  WriteFile(images + "/000000000004.jpg", EncodeJpeg(MakeImage(32, 32, 3, 2)));
  WriteFile(images + "/000000000012.jpg", EncodeJpeg(MakeImage(32, 32, 3, 3)));
  WriteFile(images + "/000000000013.jpg", EncodeJpeg(MakeImage(32, 32, 3, 4)));
  WriteFile(images + "/000000000014.jpg", EncodeJpeg(MakeImage(32, 32, 3, 5)));
  const nlohmann::json coco = {
      {"info", {{"year", 2017}}},
      {"images",
       {{{"id", 9}, {"file_name", "000000000009.jpg"}, {"width", 64}, {"height", 48}},
        {{"id", 4}, {"file_name", "000000000004.jpg"}, {"width", 32}, {"height", 32}},
        {{"id", 12}, {"file_name", "000000000012.jpg"}, {"width", 32}, {"height", 32}},
        {{"id", 13}, {"file_name", "000000000013.jpg"}, {"width", 32}, {"height", 32}},
        {{"id", 14}, {"file_name", "000000000014.jpg"}, {"width", 32}, {"height", 32}}}},
      {"annotations",
       {{{"id", 1},
         {"image_id", 9},
         {"category_id", 7},
         {"bbox", {8.5, 12, 16, 24}},
         {"iscrowd", 0},
         {"segmentation", {{8.5, 12, 24.5, 12, 24.5, 36}}}},
        {{"id", 2}, {"image_id", 9}, {"category_id", 1}, {"bbox", {0, 0, 64, 48}}, {"iscrowd", 1}},
        {{"id", 3}, {"image_id", 12}, {"category_id", 5}, {"bbox", {1, 1, 2, 2}}},
        {{"id", 4}, {"image_id", 13}, {"category_id", 1}, {"bbox", {1, 1, -2, 2}}},
        {{"id", 5}, {"image_id", 14}, {"category_id", 3}, {"bbox", {1, 1, 30, 2}}}}},
      {"categories",
       {{{"id", 7}, {"name", "train"}},
        {{"id", 1}, {"name", "person"}},
        {{"id", 3}, {"name", "car"}}}}};
  WriteFile(dir_ / "instances_val2017.json", coco.dump());
  ConvertOptions o;
  o.coco = dir_ / "instances_val2017.json";
  o.root = images;
  o.out = dir_ / "coco_db";
  const ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(s.items, 5);
  EXPECT_EQ(s.converted, 3);
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.classes, 4);
  // Categories in id order, named by id as Caffe SSD's labelmap_coco.prototxt names them.
  const std::vector<LabelMapEntry> map = ReadLabelMap(o.out + "/labelmap.prototxt");
  ASSERT_EQ(map.size(), 4u);
  EXPECT_EQ(map[1].name, "1");
  EXPECT_EQ(map[1].display_name, "person");
  EXPECT_EQ(map[2].name, "3");
  EXPECT_EQ(map[3].name, "7");
  EXPECT_EQ(map[3].display_name, "train");
  EXPECT_EQ(ReadFileBytes(o.out + "/classes.txt"), "background\nperson\ncar\ntrain\n");
  // Images in id order: 4 (no objects), 9, 12 (unknown category), 13 (bad bbox), 14.
  const auto records = ReadAll(o.out);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].first, "00000000_000000000004.jpg");
  EXPECT_TRUE(BoxesOf(records[0].second).empty());
  EXPECT_EQ(records[1].first, "00000001_000000000009.jpg");
  const std::vector<BoxAnnotation> b = BoxesOf(records[1].second);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].label, 3);  // category 7
  EXPECT_FALSE(b[0].difficult);
  EXPECT_FLOAT_EQ(b[0].xmin, 8.5f / 64);
  EXPECT_FLOAT_EQ(b[0].ymin, 12.0f / 48);
  EXPECT_FLOAT_EQ(b[0].xmax, 24.5f / 64);
  EXPECT_FLOAT_EQ(b[0].ymax, 36.0f / 48);
  EXPECT_EQ(b[1].label, 1);
  EXPECT_TRUE(b[1].difficult);  // a crowd region
  EXPECT_EQ(records[2].first, "00000004_000000000014.jpg");
  const std::string skipped = ReadFileBytes(o.out + "/skipped.txt");
  EXPECT_NE(skipped.find("000000000012.jpg\tinstances_val2017.json image id 12: annotation 3 has "
                         "category_id 5, not one of the categories"),
            std::string::npos)
      << skipped;
  EXPECT_NE(skipped.find("000000000013.jpg\tinstances_val2017.json image id 13: annotation 4 has "
                         "bbox [1,1,-2,2], not [x, y, width, height] with width, height >= 0"),
            std::string::npos)
      << skipped;

  // A file that is not COCO's.
  WriteFile(dir_ / "not_coco.json", "{\"images\": []}");
  o.coco = dir_ / "not_coco.json";
  o.out = dir_ / "coco_db2";
  try {
    ConvertImages(o);
    FAIL() << "accepted a file without annotations and categories";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a COCO instances file"), std::string::npos)
        << e.what();
  }
}

TEST_F(DetectionConvertTest, OptionsThatDoNotFitAreRefused) {
  auto refused = [&](ConvertOptions o, const std::string& want) {
    try {
      ConvertImages(o);
      ADD_FAILURE() << "accepted; wanted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  ConvertOptions o = Voc("refused");
  o.split = "val";
  refused(o, "--split val: cannot read " + voc07_ +
                 "/ImageSets/Main/val.txt (splits there: test, "
                 "trainval)");
  o = Voc("refused");
  o.list = dir_ / "list.txt";
  refused(o, "--list is for classification");
  o = Voc("refused");
  o.classes = dir_ / "classes.txt";
  refused(o, "--classes is for classification");
  o = Voc("refused");
  o.root = dir_.path();  // not a VOC root
  o.extra_roots = {voc12_};
  refused(o, "several --root folders join Pascal VOC roots only");
  o.extra_roots.clear();
  refused(o, "--split and --label-map are for detection sets");
  o = Voc("refused");
  o.extra_roots = {dir_.path()};
  refused(o, "is not a Pascal VOC root");
  // An existing database is refused as for classification, before any work.
  ConvertImages(Voc("exists"));
  refused(Voc("exists"), "pass --overwrite to replace it");
}

// scripts/experiments/make_fashion_detection.py writes a VOC-layout set that convert reads
// whole, the same for the same seed. Skipped where python3-numpy, python3-pil or Debian's
// dataset-fashion-mnist is missing.
TEST_F(DetectionConvertTest, TheFashionMiniatureConverts) {
  if (std::system("/usr/bin/python3 -c 'import numpy, PIL' >/dev/null 2>&1") != 0 ||
      !fs::exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "needs python3-numpy, python3-pil and dataset-fashion-mnist";
  }
  const std::string script =
      std::string(CORTADO_SOURCE_DIR) + "/scripts/experiments/make_fashion_detection.py";
  for (const char* out : {"fashion", "fashion_again"}) {
    const std::string cmd = "/usr/bin/python3 " + script + " --out " + (dir_ / out) +
                            " --train 12 --test 5 --seed 3 >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  const std::string root = dir_ / "fashion";
  const std::vector<std::string> lists = {"ImageSets/Main/trainval.txt", "ImageSets/Main/test.txt",
                                          "Annotations/train_000007.xml",
                                          "JPEGImages/test_000004.jpg"};
  for (const std::string& f : lists) {
    EXPECT_EQ(ReadFileBytes(root + "/" + f), ReadFileBytes(dir_ / ("fashion_again/" + f))) << f;
  }
  // Every object of the XML files reaches the records.
  auto objects = [&](const std::string& split) {
    int64_t n = 0;
    for (const std::string& id : SplitLines(ReadFileBytes(root + "/ImageSets/Main/" + split))) {
      n += static_cast<int64_t>(
          testing::CountOf(ReadFileBytes(root + "/Annotations/" + id + ".xml"), "<object>"));
    }
    return n;
  };
  ConvertOptions o;
  o.root = root;
  o.split = "trainval";
  o.out = root + "/trainval_lmdb";
  const ConvertSummary train = ConvertImages(o);
  EXPECT_EQ(train.converted, 12);
  EXPECT_EQ(train.skipped, 0);
  EXPECT_EQ(train.clipped_boxes, 0);
  EXPECT_EQ(train.boxes, objects("trainval.txt"));
  EXPECT_GE(train.boxes, 12);
  const std::set<std::string> fashion = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                         "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                         "Bag",         "Ankle boot"};
  const std::vector<LabelMapEntry> map = ReadLabelMap(o.out + "/labelmap.prototxt");
  for (size_t i = 1; i < map.size(); ++i) EXPECT_EQ(fashion.count(map[i].name), 1u) << map[i].name;
  o.split = "test";
  o.out = root + "/test_lmdb";
  o.label_map = root + "/trainval_lmdb/labelmap.prototxt";
  const ConvertSummary test = ConvertImages(o);
  // A test item of a class no training image has would be skipped: count what was kept.
  EXPECT_EQ(test.converted + test.skipped, 5);
  EXPECT_GE(test.converted, 1);
  const auto records = ReadAll(o.out);
  for (const auto& [key, value] : records) {
    for (const BoxAnnotation& b : BoxesOf(value)) {
      EXPECT_GE(b.label, 1);
      EXPECT_LT(b.label, static_cast<int>(map.size()));
      EXPECT_GE(b.xmax - b.xmin, 8.0f / 128 - 1e-6f) << key << ": items are at least 8 pixels";
    }
  }
}

}  // namespace
}  // namespace cortado
