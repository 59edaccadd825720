// `cortado convert` on detection sets as a user runs it: two Pascal VOC roots joined with
// repeated --root, the --json summary's detection fields, and the one-line errors for a split
// that is not there and for options that belong to the other kind of input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/data/test_images.h"
#include "tests/tools/user_run.h"

namespace cortado::tooltest {
namespace {

class ConvertDetectionTest : public UserRun {
 protected:
  // A VOC root with one image of `objects` (name, xmin, ymin, xmax, ymax) per id.
  std::string VocRoot(const std::string& name, const std::vector<std::string>& ids,
                      const std::string& objects) {
    std::string list;
    for (const std::string& id : ids) {
      Write(name + "/JPEGImages/" + id + ".jpg",
            testing::EncodeJpeg(testing::MakeImage(32, 24, 3, static_cast<int>(list.size()))));
      Write(name + "/Annotations/" + id + ".xml",
            "<annotation><size><width>32</width><height>24</height></size>" + objects +
                "</annotation>");
      list += id + "\n";
    }
    Write(name + "/ImageSets/Main/trainval.txt", list);
    return (dir_ / name).string();
  }
};

std::string Object(const std::string& name, int x0, int y0, int x1, int y1) {
  return StrCat("<object><name>", name, "</name><bndbox><xmin>", x0, "</xmin><ymin>", y0,
                "</ymin><xmax>", x1, "</xmax><ymax>", y1, "</ymax></bndbox></object>");
}

TEST_F(ConvertDetectionTest, JoinsVocRootsAndSummarizesTheObjects) {
  const std::string voc07 = VocRoot("VOC2007", {"000001", "000002"},
                                    Object("dog", 1, 1, 10, 10) + Object("cat", 5, 5, 40, 20));
  const std::string voc12 = VocRoot("VOC2012", {"2012_000001"}, Object("bird", 2, 2, 8, 8));
  const std::string db = (dir_ / "trainval_lmdb").string();
  std::string out, err;
  ASSERT_EQ(Cortado("convert --root " + voc07 + " --root " + voc12 + " --split trainval --out " +
                        db + " --json",
                    &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["task"], "detection");
  EXPECT_EQ(j["converted"], 3);
  EXPECT_EQ(j["skipped"], 0);
  EXPECT_EQ(j["classes"], 4);  // background, bird, cat, dog
  EXPECT_EQ(j["boxes"], 5);
  EXPECT_EQ(j["clipped_boxes"], 2);  // cat's xmax 40 lies past the 32-pixel width
  EXPECT_EQ(j["label_map"], db + "/labelmap.prototxt");
  EXPECT_EQ(Read("trainval_lmdb/classes.txt"), "background\nbird\ncat\ndog\n");

  // inspect --db reads the records as what they are.
  ASSERT_EQ(Cortado("inspect --db " + db, &out, &err), 0) << err;
  EXPECT_NE(out.find("3 encoded (JPEG), 0 raw, 0 unreadable; 3 distinct labels"), std::string::npos)
      << out;
  EXPECT_NE(out.find("objects    5 in the sampled records (1.67 per image), 0 difficult: Caffe SSD "
                     "AnnotatedDatum records (detection)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("sizes      WxHxC (records): 32x24x3 (3)"), std::string::npos) << out;

  // The text summary names the objects and the label map.
  ASSERT_EQ(
      Cortado("convert --root " + voc07 + " --split trainval --out " +
                  (dir_ / "voc07_lmdb").string() + " --label-map " + db + "/labelmap.prototxt",
              &out, &err),
      0)
      << err;
  EXPECT_NE(out.find("4 objects (2 clipped to their image); classes numbered in "),
            std::string::npos)
      << out;
}

TEST_F(ConvertDetectionTest, MistakesAreOneLineNamingWhatToDo) {
  const std::string voc = VocRoot("VOC2007", {"000001"}, Object("dog", 1, 1, 10, 10));
  std::string out, err;
  EXPECT_EQ(
      Cortado("convert --root " + voc + " --split val --out " + (dir_ / "db").string(), &out, &err),
      1);
  EXPECT_NE(err.find("--split val: cannot read " + voc +
                     "/ImageSets/Main/val.txt (splits there: trainval)"),
            std::string::npos)
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  WriteImages("folder", {"a", "b"});
  EXPECT_NE(Cortado("convert --root " + (dir_ / "folder").string() + " --root " + voc + " --out " +
                        (dir_ / "db").string(),
                    &out, &err),
            0);
  EXPECT_NE(err.find("several --root folders join Pascal VOC roots only"), std::string::npos)
      << err;
  EXPECT_NE(Cortado("convert --coco " + (dir_ / "none.json").string() + " --root " + voc +
                        " --out " + (dir_ / "db").string(),
                    &out, &err),
            0);
  EXPECT_NE(err.find("--coco"), std::string::npos) << err;
}

}  // namespace
}  // namespace cortado::tooltest
