// The converter on a folder holding ImageNet's oddities, all made here: RGB, progressive and
// nested JPEGs (stored byte for byte), grey, CMYK and YCCK JPEGs, a PNG named .JPEG, a real PNG
// and a JPEG truncated inside its data (re-encoded), a very large and a 1x1 image, and broken
// files (truncated inside the header, empty, text named .JPEG) that are skipped and listed.
// Then one channel count for every record (Caffe's convert_imageset, --gray), and conversions
// that fail, are stopped or are killed part way: --out is never left holding part of a database.
#include "data/converter.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "data/datum.h"
#include "data/jpeg.h"
#include "data/lmdb.h"
#include "data/lmdb_source.h"
#include "data/transforms.h"
#include "tests/data/test_images.h"

namespace cortado {
namespace {

namespace fs = std::filesystem;
using testing::EncodeCmykJpeg;
using testing::EncodeJpeg;
using testing::EncodeWithOpenCV;
using testing::EncodeYcckJpeg;
using testing::MakeImage;
using testing::MeanAbsDiff;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::WriteFile;

struct Expect {
  int label;
  bool stored_as_is;  // else re-encoded
  int channels;
  int width, height;
  ImageU8 pixels;  // what the stored image should look like (re-encoded ones)
};

std::vector<std::pair<std::string, std::string>> ReadAll(const std::string& db) {
  LmdbReader reader(db);
  auto txn = reader.BeginRead();
  std::vector<std::pair<std::string, std::string>> out;
  for (int64_t i = 0; i < reader.size(); ++i) {
    out.emplace_back(std::string(reader.key(i)), std::string(txn.Get(i)));
  }
  return out;
}

// Grey to RGB, three equal channels: what a grey input looks like as a 3-channel record.
ImageU8 GrayToRgb(const ImageU8& gray) {
  ImageU8 rgb;
  rgb.Reshape(gray.width, gray.height, 3);
  for (int i = 0; i < gray.width * gray.height; ++i) {
    for (int c = 0; c < 3; ++c) rgb.pixels[i * 3 + c] = gray.pixels[i];
  }
  return rgb;
}

// The entries of `dir` whose names start with `prefix` (a conversion's temporaries).
std::vector<std::string> EntriesStartingWith(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name);
  }
  return out;
}

ImageU8 DecodeJpeg(std::string_view bytes, int* warnings = nullptr) {
  JpegDecoder dec;
  ImageU8 out;
  EXPECT_TRUE(dec.DecodeFull(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &out))
      << dec.message();
  if (warnings != nullptr) *warnings = dec.warnings();
  return out;
}

class ConverterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    expect_ = new std::map<std::string, Expect>();
    const std::string root = *dir_ / "images";
    auto add = [&](const std::string& rel, const std::string& bytes) {
      WriteFile(root + "/" + rel, bytes);
    };
    auto as_is = [&](const std::string& rel, int label, const ImageU8& img, int quality,
                     bool progressive) {
      add(rel, EncodeJpeg(img, quality, progressive));
      (*expect_)[rel] = Expect{label, true, img.channels, img.width, img.height, {}};
    };
    auto reencoded = [&](const std::string& rel, int label, const ImageU8& look) {
      (*expect_)[rel] = Expect{label, false, 3, look.width, look.height, look};
    };
    // bird (label 0): ordinary files, one in a subfolder, one non-image file.
    as_is("bird/a_rgb.JPEG", 0, MakeImage(300, 200, 3, 1), 90, false);
    const ImageU8 gray = MakeImage(120, 90, 1, 2);  // 3-channel records: becomes RGB
    add("bird/b_gray.JPEG", EncodeJpeg(gray, 90));
    reencoded("bird/b_gray.JPEG", 0, GrayToRgb(gray));
    as_is("bird/c_progressive.JPEG", 0, MakeImage(160, 200, 3, 3), 85, true);
    as_is("bird/sub/d_nested.jpg", 0, MakeImage(64, 64, 3, 4), 90, false);
    add("bird/notes.txt", "not listed: no image extension");
    add("bird/.hidden.JPEG", "hidden files are left out");
    // cat (label 1): colour spaces and formats that need re-encoding, extreme sizes.
    const ImageU8 cmyk = MakeImage(200, 150, 3, 5);
    add("cat/cmyk.JPEG", EncodeCmykJpeg(cmyk));
    reencoded("cat/cmyk.JPEG", 1, cmyk);
    const ImageU8 ycck = MakeImage(90, 120, 3, 6);
    add("cat/ycck.JPEG", EncodeYcckJpeg(ycck));
    reencoded("cat/ycck.JPEG", 1, ycck);
    const ImageU8 png = MakeImage(130, 100, 3, 7);
    add("cat/png_named.JPEG", EncodeWithOpenCV(png, ".png"));
    reencoded("cat/png_named.JPEG", 1, png);
    const ImageU8 gray_png = MakeImage(50, 40, 1, 8);
    add("cat/real.png", EncodeWithOpenCV(gray_png, ".png"));
    reencoded("cat/real.png", 1, GrayToRgb(gray_png));  // an RGB JPEG, three equal channels
    as_is("cat/huge.JPEG", 1, MakeImage(5000, 3500, 3, 9), 75, false);
    as_is("cat/tiny.JPEG", 1, MakeImage(1, 1, 3, 10), 90, false);
    // dog (label 2): broken files, and one JPEG cut inside its data (repaired).
    const std::string ok = EncodeJpeg(MakeImage(100, 80, 3, 11), 90);
    add("dog/ok.JPEG", ok);
    (*expect_)["dog/ok.JPEG"] = Expect{2, true, 3, 100, 80, {}};
    add("dog/trunc_header.JPEG", ok.substr(0, 60));
    const std::string cut = ok.substr(0, ok.size() * 7 / 10);
    add("dog/trunc_data.JPEG", cut);
    int warnings = 0;
    ImageU8 recovered = DecodeJpeg(cut, &warnings);
    EXPECT_GT(warnings, 0);
    reencoded("dog/trunc_data.JPEG", 2, recovered);
    add("dog/empty.JPEG", "");
    add("dog/text.JPEG", "Lorem ipsum dolor sit amet, not a JPEG.\n");
    fs::create_directories(root + "/.cache/x");  // a hidden folder is not a class
  }
  static void TearDownTestSuite() {
    delete expect_;
    delete dir_;
  }

  static ConvertOptions Options(const std::string& out) {
    ConvertOptions o;
    o.root = *dir_ / "images";
    o.out = out;
    o.threads = 2;
    return o;
  }

  static TempDir* dir_;
  static std::map<std::string, Expect>* expect_;
};
TempDir* ConverterTest::dir_ = nullptr;
std::map<std::string, Expect>* ConverterTest::expect_ = nullptr;

TEST_F(ConverterTest, FolderWithOddities) {
  const std::string db = *dir_ / "db_main";
  const ConvertSummary s = ConvertImages(Options(db));
  EXPECT_EQ(s.items, 15);
  EXPECT_EQ(s.converted, 12);
  EXPECT_EQ(s.reencoded, 6);
  EXPECT_EQ(s.skipped, 3);
  EXPECT_EQ(s.ignored, 1);
  EXPECT_EQ(s.classes, 3);
  EXPECT_EQ(ReadFileBytes(db + "/classes.txt"), "bird\ncat\ndog\n");
  // The completion record, written before the folder was renamed into place.
  const std::optional<LmdbCompletion> done = ReadLmdbCompletion(db);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->records, 12);
  EXPECT_EQ(done->skipped, 3);
  EXPECT_EQ(done->classes, 3);
  EXPECT_EQ(done->channels, 3);
  EXPECT_EQ(EntriesStartingWith(dir_->path(), "db_main."), std::vector<std::string>{});

  // skipped.txt: path, tab, reason.
  const std::string skipped = ReadFileBytes(db + "/skipped.txt");
  EXPECT_NE(skipped.find("dog/empty.JPEG\tempty file\n"), std::string::npos) << skipped;
  EXPECT_NE(skipped.find("dog/trunc_header.JPEG\tcorrupt JPEG: "), std::string::npos) << skipped;
  EXPECT_NE(skipped.find("dog/text.JPEG\tnot a decodable image"), std::string::npos) << skipped;
  // The file without an image extension is named too (issue 30 item 14), first.
  EXPECT_EQ(skipped.rfind("bird/notes.txt\tignored: no image extension\n", 0), 0u) << skipped;
  EXPECT_EQ(s.ignored_files, std::vector<std::string>{"bird/notes.txt"});
  EXPECT_EQ(std::count(skipped.begin(), skipped.end(), '\n'), 4);

  // Records in ImageFolder order, numbered by list position (skipped items leave gaps).
  const std::vector<std::string> order = {
      "bird/a_rgb.JPEG", "bird/b_gray.JPEG",    "bird/c_progressive.JPEG", "bird/sub/d_nested.jpg",
      "cat/cmyk.JPEG",   "cat/huge.JPEG",       "cat/png_named.JPEG",      "cat/real.png",
      "cat/tiny.JPEG",   "cat/ycck.JPEG",       "dog/empty.JPEG",          "dog/ok.JPEG",
      "dog/text.JPEG",   "dog/trunc_data.JPEG", "dog/trunc_header.JPEG"};
  const auto records = ReadAll(db);
  ASSERT_EQ(records.size(), 12u);
  size_t r = 0;
  DatumParser parser;
  for (size_t i = 0; i < order.size(); ++i) {
    if (expect_->count(order[i]) == 0) continue;  // a skipped one
    char key[600];
    std::snprintf(key, sizeof(key), "%08zu_%s", i, order[i].c_str());
    ASSERT_LT(r, records.size());
    EXPECT_EQ(records[r].first, key);
    const Expect& e = expect_->at(order[i]);
    ASSERT_TRUE(parser.Parse(records[r].second.data(), records[r].second.size()));
    const DatumFields& f = parser.fields();
    EXPECT_TRUE(f.encoded) << key;
    EXPECT_EQ(f.label, e.label) << key;
    EXPECT_EQ(f.width, e.width) << key;
    EXPECT_EQ(f.height, e.height) << key;
    EXPECT_EQ(f.channels, e.channels) << key;
    const std::string_view data = parser.data();
    const std::string original = ReadFileBytes(*dir_ / "images/" + order[i]);
    if (e.stored_as_is) {
      EXPECT_TRUE(data == original) << key << " should be stored byte for byte";
    } else {
      // Re-encoded as a clean RGB JPEG that decodes without warnings to the same picture.
      int warnings = -1;
      const ImageU8 decoded = DecodeJpeg(data, &warnings);
      EXPECT_EQ(warnings, 0) << key;
      ASSERT_EQ(decoded.channels, 3) << key;
      EXPECT_LT(MeanAbsDiff(decoded, e.pixels), 8.0) << key;
    }
    ++r;
  }
}

TEST_F(ConverterTest, RoundTripPixelsEqualADirectDecode) {
  // Train-style round trip: every record decodes to the pixels a direct decode of the source
  // file gives (exactly, for JPEGs stored as they are).
  const std::string db = *dir_ / "db_roundtrip";
  ConvertOptions o = Options(db);
  ConvertImages(o);
  DatumParser parser;
  for (const auto& [key, value] : ReadAll(db)) {
    ASSERT_TRUE(parser.Parse(value.data(), value.size()));
    const std::string rel = key.substr(9);
    const Expect& e = expect_->at(rel);
    if (!e.stored_as_is) continue;
    ImageU8 direct;
    std::string why;
    const std::string original = ReadFileBytes(*dir_ / "images/" + rel);
    ASSERT_TRUE(DecodeWithOpenCV(reinterpret_cast<const uint8_t*>(original.data()), original.size(),
                                 true, &direct, &why));
    EXPECT_EQ(MeanAbsDiff(DecodeJpeg(parser.data()), direct), 0.0) << rel;
  }
}

TEST_F(ConverterTest, SameDatabaseWhateverTheThreadsAndMapSize) {
  ConvertOptions one = Options(*dir_ / "db_t1");
  one.threads = 1;
  ConvertOptions many = Options(*dir_ / "db_t5");
  many.threads = 5;
  many.initial_map_size = size_t{64} << 10;  // 64 KiB for ~0.5 MB of records: must grow
  ConvertImages(one);
  const ConvertSummary s = ConvertImages(many);
  EXPECT_GT(s.map_growths, 0);
  EXPECT_EQ(ReadAll(*dir_ / "db_t1"), ReadAll(*dir_ / "db_t5"));
  EXPECT_EQ(ReadFileBytes(*dir_ / "db_t1/skipped.txt"), ReadFileBytes(*dir_ / "db_t5/skipped.txt"));
}

TEST_F(ConverterTest, RefusesAnExistingDatabaseUnlessOverwrite) {
  ConvertOptions o = Options(*dir_ / "db_again");
  o.resize_width = 8;
  o.resize_height = 8;
  ConvertImages(o);
  try {
    ConvertOptions again = o;
    again.root = *dir_ / "no_such_folder";  // refused before any work: before the listing
    ConvertImages(again);
    FAIL() << "a second run into the same database must refuse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(o.out), std::string::npos) << e.what();
  }
  o.overwrite = true;
  o.resize_width = 0;
  o.resize_height = 0;
  o.resize_shorter = 16;
  const ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(s.converted, 12);
  EXPECT_EQ(ReadAll(o.out).size(), 12u);
}

// Caffe's data layer and compute_image_mean take the first record's shape for every record, so
// a database must not mix 1- and 3-channel images: whatever mix of grey and colour JPEGs goes
// in, every record decodes to 3 channels (1 with --gray), with and without resizing. Decoded
// here as Caffe decodes an encoded record (cv::imdecode, IMREAD_UNCHANGED) and with libjpeg.
TEST_F(ConverterTest, EveryRecordHasOneChannelCount) {
  const std::string root = *dir_ / "mixed";
  for (int i = 0; i < 8; ++i) {
    const int channels = i % 2 == 0 ? 1 : 3;
    WriteFile(root + "/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".JPEG",
              EncodeJpeg(MakeImage(70 + 5 * i, 50 + 3 * i, channels, i), 90, i == 4));
  }
  WriteFile(root + "/c0/gray.png", EncodeWithOpenCV(MakeImage(40, 30, 1, 9), ".png"));
  WriteFile(root + "/c1/rgb.png", EncodeWithOpenCV(MakeImage(40, 30, 3, 10), ".png"));
  int run = 0;
  for (bool gray : {false, true}) {
    for (int resize : {0, 64}) {
      ConvertOptions o;
      o.root = root;
      o.out = *dir_ / ("db_channels_" + std::to_string(run++));
      o.gray = gray;
      o.resize_width = o.resize_height = resize;
      const ConvertSummary s = ConvertImages(o);
      ASSERT_EQ(s.converted, 10);
      const int want = gray ? 1 : 3;
      const std::string what = StrCat(gray ? "--gray" : "colour", ", resize ", resize);
      const std::optional<LmdbCompletion> done = ReadLmdbCompletion(o.out);
      ASSERT_TRUE(done.has_value()) << what;
      EXPECT_EQ(done->channels, want) << what;
      DatumParser parser;
      for (const auto& [key, value] : ReadAll(o.out)) {
        ASSERT_TRUE(parser.Parse(value.data(), value.size())) << key;
        EXPECT_EQ(parser.fields().channels, want) << key << ", " << what;
        const std::string_view data = parser.data();
        EXPECT_EQ(DecodeJpeg(data).channels, want) << key << ", " << what;
        const cv::Mat caffe = cv::imdecode(
            cv::Mat(1, static_cast<int>(data.size()), CV_8U, const_cast<char*>(data.data())),
            cv::IMREAD_UNCHANGED);
        EXPECT_EQ(caffe.channels(), want) << key << ", " << what;
        if (resize > 0) {
          EXPECT_EQ(caffe.cols, 64) << key;
        }
      }
      // Byte for byte only where the input already had the records' channel count.
      EXPECT_EQ(s.reencoded, resize > 0 ? 10 : 6) << what;
    }
  }
}

// A conversion that fails part way (here: a test hook throws after 3 records) removes its
// temporary, and --out does not appear.
TEST_F(ConverterTest, FailurePartWayLeavesNoDatabase) {
  ConvertOptions o = Options(*dir_ / "db_failed");
  o.on_record = [](int64_t done) {
    if (done == 3) Fail("disk full (test)");
  };
  try {
    ConvertImages(o);
    FAIL() << "the hook's error must reach the caller";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disk full"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.out));
  EXPECT_EQ(EntriesStartingWith(dir_->path(), "db_failed"), std::vector<std::string>{});
}

// --overwrite replaces the old database only once the new one is complete: while it is being
// written, --out still reads as the old database (complete, same records); a conversion that is
// stopped (SIGINT/SIGTERM in the tool) or fails leaves the old one in place.
TEST_F(ConverterTest, OverwriteKeepsTheOldDatabaseUntilTheNewOneIsComplete) {
  ConvertOptions o = Options(*dir_ / "db_replace");
  o.resize_width = o.resize_height = 8;
  ConvertImages(o);
  const auto old_records = ReadAll(o.out);
  ASSERT_EQ(old_records.size(), 12u);

  o.overwrite = true;
  o.resize_width = o.resize_height = 16;
  std::atomic<bool> stop{false};
  o.stop = &stop;
  o.on_record = [&](int64_t done) {
    if (done == 4) stop = true;
  };
  try {
    ConvertImages(o);
    FAIL() << "a stopped conversion must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ReadAll(o.out), old_records);
  EXPECT_TRUE(ReadLmdbCompletion(o.out).has_value());
  EXPECT_EQ(EntriesStartingWith(dir_->path(), "db_replace."), std::vector<std::string>{});

  stop = false;
  int64_t checks = 0;
  o.on_record = [&](int64_t) {
    EXPECT_EQ(ReadAll(o.out), old_records) << "--out changed before the new database was done";
    EXPECT_EQ(EntriesStartingWith(dir_->path(), "db_replace.partial-").size(), 1u);
    ++checks;
  };
  const ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(checks, 15);  // every item, skipped ones included
  EXPECT_EQ(s.converted, 12);
  const auto new_records = ReadAll(o.out);
  ASSERT_EQ(new_records.size(), 12u);
  EXPECT_NE(new_records, old_records);
  DatumParser parser;
  ASSERT_TRUE(parser.Parse(new_records[0].second.data(), new_records[0].second.size()));
  EXPECT_EQ(parser.fields().width, 16);
  const std::optional<LmdbCompletion> done = ReadLmdbCompletion(o.out);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->records, 12);
  EXPECT_EQ(EntriesStartingWith(dir_->path(), "db_replace."), std::vector<std::string>{});
}

// A conversion killed outright (SIGKILL: nothing runs to clean up) leaves its temporary but no
// --out; the temporary is refused as a database (no completion record), and the next conversion
// into the same --out removes it.
TEST_F(ConverterTest, KilledConversionLeavesNoDatabaseAndItsTemporaryIsRemovedLater) {
  ConvertOptions o = Options(*dir_ / "db_killed");
  o.on_record = [](int64_t done) {
    if (done == 5) ::raise(SIGKILL);
  };
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      ConvertImages(o);
    } catch (...) {
    }
    ::_exit(0);  // not reached when the kill worked
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  EXPECT_FALSE(fs::exists(o.out));
  const std::vector<std::string> left = EntriesStartingWith(dir_->path(), "db_killed.partial-");
  ASSERT_EQ(left.size(), 1u);
  const std::string partial = *dir_ / left[0];
  EXPECT_NE(left[0].find("-" + std::to_string(pid)), std::string::npos) << left[0];
  ASSERT_TRUE(IsLmdb(partial));
  EXPECT_FALSE(ReadLmdbCompletion(partial).has_value());
  try {
    CheckLmdbComplete(partial, 4);
    FAIL() << "a killed conversion's temporary must not be read as a database";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(partial), std::string::npos) << what;
    EXPECT_NE(what.find("cortado convert"), std::string::npos) << what;
    EXPECT_NE(what.find("--overwrite"), std::string::npos) << what;
  }

  o.on_record = nullptr;
  const ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(s.converted, 12);
  EXPECT_FALSE(fs::exists(partial)) << "the dead process's temporary is removed";
  EXPECT_EQ(EntriesStartingWith(dir_->path(), "db_killed."), std::vector<std::string>{});
}

// An --out that exists but is not a database is never replaced, not even with --overwrite; an
// empty folder is.
TEST_F(ConverterTest, OutThatIsNotADatabaseIsNotReplaced) {
  const std::string out = *dir_ / "not_a_db";
  WriteFile(out + "/notes.txt", "mine");
  ConvertOptions o = Options(out);
  o.overwrite = true;
  try {
    ConvertImages(o);
    FAIL() << "a folder that is not a database must not be replaced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(out), std::string::npos) << e.what();
  }
  EXPECT_EQ(ReadFileBytes(out + "/notes.txt"), "mine");
  const std::string empty = *dir_ / "empty_out";
  fs::create_directories(empty);
  o = Options(empty + "/");  // a trailing slash names the same folder
  o.resize_width = o.resize_height = 8;
  EXPECT_EQ(ConvertImages(o).converted, 12);
  EXPECT_EQ(ReadAll(empty).size(), 12u);
}

TEST_F(ConverterTest, ResizeOptions) {
  ConvertOptions o = Options(*dir_ / "db_shorter");
  o.resize_shorter = 32;
  ConvertSummary s = ConvertImages(o);
  EXPECT_EQ(s.reencoded, s.converted);
  DatumParser parser;
  for (const auto& [key, value] : ReadAll(o.out)) {
    ASSERT_TRUE(parser.Parse(value.data(), value.size()));
    const Expect& e = expect_->at(key.substr(9));
    const DatumFields& f = parser.fields();
    EXPECT_EQ(std::min(f.width, f.height), 32) << key;
    // The aspect ratio is kept (to a pixel).
    EXPECT_NEAR(static_cast<double>(f.width) / f.height, static_cast<double>(e.width) / e.height,
                1.0 / 16)
        << key;
    const ImageU8 img = DecodeJpeg(parser.data());
    EXPECT_EQ(img.width, f.width);
    EXPECT_EQ(img.height, f.height);
    EXPECT_EQ(img.channels, f.channels);
    EXPECT_EQ(f.channels, 3) << key << ": every record is RGB, grey inputs included";
  }
  // The huge image went through DCT scaling: it still matches a full decode + resize.
  for (const auto& [key, value] : ReadAll(o.out)) {
    if (key.find("huge") == std::string::npos) continue;
    ASSERT_TRUE(parser.Parse(value.data(), value.size()));
    const std::string original = ReadFileBytes(*dir_ / "images/cat/huge.JPEG");
    ImageU8 full, small;
    full = DecodeJpeg(original);
    ResizeImage(full, parser.fields().width, parser.fields().height, &small);
    EXPECT_LT(MeanAbsDiff(DecodeJpeg(parser.data()), small), 4.0);
  }
  o.out = *dir_ / "db_exact";
  o.resize_shorter = 0;
  o.resize_width = 20;
  o.resize_height = 10;
  ConvertImages(o);
  for (const auto& [key, value] : ReadAll(o.out)) {
    ASSERT_TRUE(parser.Parse(value.data(), value.size()));
    EXPECT_EQ(parser.fields().width, 20);
    EXPECT_EQ(parser.fields().height, 10);
  }
}

TEST_F(ConverterTest, ListFileWithClassList) {
  WriteFile(*dir_ / "list.txt",
            "cat/tiny.JPEG 2\n"
            "\n"
            "bird/b_gray.JPEG 0\n"
            "dog/empty.JPEG 1\n"
            "with space/img 1.JPEG 1\r\n");
  WriteFile(*dir_ / "images/with space/img 1.JPEG", EncodeJpeg(MakeImage(40, 30, 3), 90));
  WriteFile(*dir_ / "classes_in.txt", "n01\nn02\nn03\n");
  ConvertOptions o = Options(*dir_ / "db_list");
  o.list = *dir_ / "list.txt";
  o.classes = *dir_ / "classes_in.txt";
  const ConvertSummary s = ConvertImages(o);
  fs::remove_all(*dir_ / "images/with space");
  EXPECT_EQ(s.items, 4);
  EXPECT_EQ(s.converted, 3);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(ReadFileBytes(o.out + "/classes.txt"), "n01\nn02\nn03\n");
  const auto records = ReadAll(o.out);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].first, "00000000_cat/tiny.JPEG");
  EXPECT_EQ(records[1].first, "00000001_bird/b_gray.JPEG");
  EXPECT_EQ(records[2].first, "00000003_with space/img 1.JPEG");
  DatumParser parser;
  const int labels[] = {2, 0, 1};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(parser.Parse(records[i].second.data(), records[i].second.size()));
    EXPECT_EQ(parser.fields().label, labels[i]);
  }
  // A label beyond the class list is an error, and so is a malformed line.
  WriteFile(*dir_ / "list_bad.txt", "cat/tiny.JPEG 3\n");
  o.list = *dir_ / "list_bad.txt";
  o.out = *dir_ / "db_list_bad";
  EXPECT_THROW(ConvertImages(o), Error);
  WriteFile(*dir_ / "list_bad.txt", "cat/tiny.JPEG\n");
  EXPECT_THROW(ConvertImages(o), Error);
}

TEST_F(ConverterTest, ValidationFolderReusesTheTrainingClasses) {
  // A validation folder with only some classes keeps the training labels.
  const std::string val = *dir_ / "val";
  WriteFile(val + "/dog/x.JPEG", EncodeJpeg(MakeImage(30, 30, 3), 90));
  WriteFile(*dir_ / "train_classes.txt", "bird\ncat\ndog\n");
  ConvertOptions o;
  o.root = val;
  o.out = *dir_ / "db_val";
  o.classes = *dir_ / "train_classes.txt";
  ConvertImages(o);
  DatumParser parser;
  const auto records = ReadAll(o.out);
  ASSERT_EQ(records.size(), 1u);
  ASSERT_TRUE(parser.Parse(records[0].second.data(), records[0].second.size()));
  EXPECT_EQ(parser.fields().label, 2);
  EXPECT_EQ(ReadFileBytes(o.out + "/classes.txt"), "bird\ncat\ndog\n");
  // A folder that the class list does not know is an error.
  WriteFile(val + "/zebra/y.JPEG", EncodeJpeg(MakeImage(30, 30, 3), 90));
  o.overwrite = true;
  EXPECT_THROW(ConvertImages(o), Error);
}

TEST_F(ConverterTest, ShuffleIsASeededPermutation) {
  ConvertOptions o = Options(*dir_ / "db_shuffle_a");
  o.shuffle = true;
  o.seed = 7;
  o.resize_width = o.resize_height = 8;  // keep it quick
  ConvertImages(o);
  o.out = *dir_ / "db_shuffle_b";
  ConvertImages(o);
  o.out = *dir_ / "db_shuffle_c";
  o.seed = 8;
  ConvertImages(o);
  const auto a = ReadAll(*dir_ / "db_shuffle_a");
  EXPECT_EQ(a, ReadAll(*dir_ / "db_shuffle_b"));
  EXPECT_NE(a, ReadAll(*dir_ / "db_shuffle_c"));
  std::set<std::string> paths;
  bool sorted = true;
  for (size_t i = 0; i < a.size(); ++i) {
    paths.insert(a[i].first.substr(9));
    if (i > 0 && a[i].first.substr(9) < a[i - 1].first.substr(9)) sorted = false;
  }
  EXPECT_EQ(paths.size(), 12u);
  EXPECT_FALSE(sorted);
}

TEST_F(ConverterTest, NothingConvertible) {
  const std::string root = *dir_ / "broken_only";
  WriteFile(root + "/a/1.JPEG", "");
  WriteFile(root + "/a/2.JPEG", "nope");
  ConvertOptions o;
  o.root = root;
  o.out = *dir_ / "db_broken";
  const ConvertSummary s = ConvertImages(o);  // not an exception: the tool exits 1
  EXPECT_EQ(s.converted, 0);
  EXPECT_EQ(s.skipped, 2);
  // Folders without class subfolders, and missing roots, are errors.
  o.root = *dir_ / "broken_only/a";
  o.out = *dir_ / "db_flat";
  EXPECT_THROW(ConvertImages(o), Error);
  o.root = *dir_ / "missing";
  EXPECT_THROW(ConvertImages(o), Error);
}

TEST(ConvertSummaryTest, JsonIsOneObject) {
  ConvertSummary s;
  s.db = "a\"b";
  s.items = 3;
  s.converted = 2;
  s.seconds = 0.5;
  const std::string json = SummaryJson(s);
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_EQ(json.find('\n'), std::string::npos);
  // A path with a quote stays valid JSON.
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j.at("db"), "a\"b");
  EXPECT_EQ(j.at("converted"), 2);
  EXPECT_EQ(j.at("skipped"), 0);
  EXPECT_DOUBLE_EQ(j.at("images_per_s").get<double>(), 6.0);
}

}  // namespace
}  // namespace cortado
