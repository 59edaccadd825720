// "Did you mean" (issue 40, item 12): the nearest known name by edit distance; a known name that
// the misspelling begins is a candidate, but does not beat one fewer edits away.
#include "engine/base/closest_name.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cortado {
namespace {

TEST(ClosestName, APrefixMatchDoesNotBeatACloserName) {
  // "code" begins "codec_candidates" (declared first) but is one edit from "codec".
  EXPECT_EQ(ClosestName("code", {"codec_candidates", "codec"}), "codec");
  // "warmup" begins all three; warmup_iters is the fewest edits away.
  EXPECT_EQ(ClosestName("warmup", {"warmup_epochs", "warmup_iters", "warmup_factor"}),
            "warmup_iters");
}

TEST(ClosestName, APrefixOrTwoEditsAreCloseEnoughAndTiesGoToTheFirstListed) {
  EXPECT_EQ(ClosestName("max_iters", {"base_lr", "max_iter", "max_epochs"}), "max_iter");
  EXPECT_EQ(ClosestName("warmup", {"warmup_epochs", "warmup_factor"}), "warmup_epochs");
  EXPECT_EQ(ClosestName("in", {"train", "inspect"}), "inspect");  // a prefix, 5 edits away
  EXPECT_EQ(ClosestName("i", {"train", "inspect"}), "");          // one letter is no prefix
  EXPECT_EQ(ClosestName("zzzzzz", {"base_lr", "max_iter"}), "");
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace cortado
