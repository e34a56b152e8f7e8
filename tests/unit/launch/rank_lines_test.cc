// RankLines: the ranks' whole lines out of an MPI launcher's labelled stream. The tagged inputs
// are what Open MPI 4's mpirun --tag-output and MPICH 4's Hydra printed for two ranks writing
// pieces of lines (os.write calls apart in time), byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "launch/attempt_log.h"

namespace crucible {
namespace {

using Lines = std::vector<std::pair<int, std::string>>;

// The stream as the supervisor reads it: split at newlines, each piece to Add, then Finish.
Lines Assemble(LabelStyle style, const std::string& stream, size_t max_line = 64 * 1024) {
  RankLines ranks(style, max_line);
  Lines out;
  size_t start = 0;
  while (start < stream.size()) {
    size_t end = stream.find('\n', start);
    if (end == std::string::npos) end = stream.size();
    for (const OutputLine& line : ranks.Add(std::string_view(stream).substr(start, end - start)))
      out.emplace_back(line.rank, line.text);
    start = end + 1;
  }
  for (const OutputLine& line : ranks.Finish()) out.emplace_back(line.rank, line.text);
  return out;
}

TEST(RankLines, OpenMpisChunkLabelsMidLineAreJoinedPerRank) {
  // Rank 0 wrote "abc", then "def\n"; rank 1 wrote "xyz\n" and "partial" between them.
  const std::string stream =
      "[1,0]<stdout>:abc[1,1]<stdout>:xyz\n"
      "[1,1]<stdout>:partial-no-newline[1,0]<stdout>:def\n";
  EXPECT_EQ(Assemble(LabelStyle::kTagged, stream),
            (Lines{{1, "xyz"}, {0, "abcdef"}, {1, "partial-no-newline"}}));
}

TEST(RankLines, HydrasPatternIsReadTheSameWay) {
  const std::string stream =
      "[0,0]<hydra>:abc[0,1]<hydra>:xyz\n"
      "[0,1]<hydra>:partial-no-newline[0,0]<hydra>:def\n";
  EXPECT_EQ(Assemble(LabelStyle::kTagged, stream),
            (Lines{{1, "xyz"}, {0, "abcdef"}, {1, "partial-no-newline"}}));
}

TEST(RankLines, TheStoppedLineCutBeforeItsNewlineIsWhole) {
  // CI's failure: the newline came as a chunk of its own, labelled.
  const std::string stream =
      "[1,0]<stdout>:phase=stop signal=SIGUSR1 step=3\n"
      "[1,0]<stdout>:stopped step=2 signal=SIGUSR1 checkpoint=/r/ckpt/step-2 exit=143"
      "[1,0]<stdout>:\n";
  const Lines lines = Assemble(LabelStyle::kTagged, stream);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], (std::pair<int, std::string>{
                          0, "stopped step=2 signal=SIGUSR1 checkpoint=/r/ckpt/step-2 exit=143"}));
  auto stopped = ParseStoppedLine(lines[1].second);
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->checkpoint, "/r/ckpt/step-2");
  EXPECT_EQ(stopped->exit_code, 143);
}

TEST(RankLines, TextThatOnlyLooksLikeALabelStaysText) {
  // Not a label: no job number, a word that is not letters, a missing colon; and a "[3] " (what
  // Hydra's -l would print) is plain text.
  const std::string text = "a[3] = 5 [2]<stdout>:x [1,2]<std0>:y [1,2]<stdout> z [1,]<stdout>:w";
  EXPECT_EQ(Assemble(LabelStyle::kTagged, "[1,4]<stderr>:" + text), (Lines{{4, text}}));
}

TEST(RankLines, UnlabelledLinesAreTheLaunchersOwnAndKeepTheirPlace) {
  const std::string stream =
      "[1,0]<stdout>:step=1 loss=\n"  // a whole line (its newline came in the same chunk)
      "--------------------------------------------------------------------------\n"
      "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n";
  EXPECT_EQ(
      Assemble(LabelStyle::kTagged, stream),
      (Lines{{0, "step=1 loss="},
             {-1, "--------------------------------------------------------------------------"},
             {-1,
              "mpirun noticed that process rank 1 with PID 0 on node vm exited on "
              "signal 9 (Killed)."}}));
}

TEST(RankLines, UnfinishedLinesComeOutAtTheEndInRankOrder) {
  const std::string stream = "[1,2]<stdout>:two[1,0]<stdout>:zero[1,1]<stdout>:one\n";
  // Rank 1's piece ended the stream's line; ranks 2 and 0 never wrote their newline.
  EXPECT_EQ(Assemble(LabelStyle::kTagged, stream), (Lines{{1, "one"}, {0, "zero"}, {2, "two"}}));
}

TEST(RankLines, ARanksLineIsPassedOnWhenItReachesTheLimit) {
  // A rank that never writes a newline must not hold its output (or memory) for ever.
  std::string stream;
  for (int i = 0; i < 5; ++i) stream += "[1,0]<stdout>:abcd[1,1]<stdout>:x\n";
  const Lines lines = Assemble(LabelStyle::kTagged, stream, 8);
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines[0], (std::pair<int, std::string>{1, "x"}));
  EXPECT_EQ(lines[1], (std::pair<int, std::string>{0, "abcdabcd"}));  // the second piece: 8
  EXPECT_EQ(lines[2], (std::pair<int, std::string>{1, "x"}));
  std::string zero;
  for (const auto& [rank, text] : lines)
    if (rank == 0) zero += text;
  EXPECT_EQ(zero, "abcdabcdabcdabcdabcd");
}

TEST(RankLines, ColonLabelsAreReadAtTheLineStartOnly) {
  // srun --label sends whole lines; "1: " inside a line is text.
  EXPECT_EQ(Assemble(LabelStyle::kColon, "  3: ratio 1: 2\n0: step=1\n"),
            (Lines{{3, "ratio 1: 2"}, {0, "step=1"}}));
  EXPECT_EQ(Assemble(LabelStyle::kNone, "[1,0]<stdout>:as is\n"),
            (Lines{{-1, "[1,0]<stdout>:as is"}}));
}

}  // namespace
}  // namespace crucible
