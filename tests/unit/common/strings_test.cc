#include "common/strings.h"

#include <gtest/gtest.h>

namespace crucible {
namespace {

TEST(Strings, EditDistance) {
  EXPECT_EQ(EditDistance("steps", "stpes"), 2u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("seq_len", "seq_len"), 0u);
}

TEST(Strings, SplitTrimFormat) {
  EXPECT_EQ(Split("a,b,,c", ',').size(), 4u);
  EXPECT_EQ(Trim("  x y \n"), "x y");
  EXPECT_EQ(StrFormat("%d-%s", 3, "x"), "3-x");
  EXPECT_EQ(FormatFloat(0.1f), "0.100000001");
}

}  // namespace
}  // namespace crucible
