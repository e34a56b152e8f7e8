// The stage sampler (data/staged_blend_index.h) and a staged blend opened on real shards: the
// anneal stays within one sample of its cumulative interpolated target at every prefix, the part
// of each stage after its anneal within one sample of the stage's weights at every prefix of it,
// datasets go on through their samples across stages, and one stage is the plain blend.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "data/blend_index.h"
#include "data/blended_dataset.h"
#include "data/stage_mixture.h"
#include "data/staged_blend_index.h"
#include "data_test_util.h"

namespace crucible {
namespace {

using testing::LetterDocs;
using testing::MakeShard;
using testing::ScratchDir;

std::vector<double> RandomShares(std::mt19937_64& rng, int datasets, bool zeros) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int power = 1 + static_cast<int>(rng() % 4);  // skewed mixes too
  std::vector<double> w(datasets);
  double total = 0;
  for (auto& x : w) {
    x = (zeros && rng() % 3 == 0) ? 0.0 : std::pow(u(rng), power) + 1e-3;
    total += x;
  }
  if (total == 0) w[0] = total = 1;
  for (auto& x : w) x /= total;
  return w;
}

// The worst |c_d(n) - L_d(n)| over every prefix n of an anneal and every dataset.
double WorstAnnealError(const std::vector<double>& from, const std::vector<double>& to, int64_t n,
                        const std::vector<uint16_t>& index) {
  std::vector<int64_t> taken(from.size(), 0);
  double worst = 0;
  for (int64_t m = 0; m <= n; ++m) {
    for (size_t d = 0; d < from.size(); ++d)
      worst = std::max(worst, std::abs(taken[d] - AnnealTarget(from[d], to[d], n, m)));
    if (m < n) ++taken[index[m]];
  }
  return worst;
}

TEST(AnnealIndex, StaysWithinOneSampleOfTheInterpolatedTargetAtEveryPrefix) {
  std::mt19937_64 rng(7);
  double worst = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int datasets = 1 + static_cast<int>(rng() % 7);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 700);
    // Datasets that fade out (q = 0), fade in (p = 0), and ones in both.
    const std::vector<double> from = RandomShares(rng, datasets, true);
    const std::vector<double> to = RandomShares(rng, datasets, true);
    std::vector<uint16_t> index(n);
    BuildAnnealIndex(from, to, n, index.data());
    for (uint16_t d : index) ASSERT_TRUE(from[d] > 0 || to[d] > 0) << "a dataset in neither mix";
    const double error = WorstAnnealError(from, to, n, index);
    ASSERT_LT(error, 1.0 + 1e-9) << "trial " << trial << ": D=" << datasets << " n=" << n;
    worst = std::max(worst, error);
  }
  EXPECT_GT(worst, 0.5);  // the bound is worked, not slack
}

TEST(AnnealIndex, TheTargetIsTheSumOfThePerSampleWeights) {
  // w_j = p + (q - p)(j + 1/2)/N: the cumulative sums equal the closed form L(n).
  const double p = 0.7, q = 0.1;
  const int64_t n = 37;
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_NEAR(AnnealTarget(p, q, n, j), sum, 1e-12);
    sum += p + (q - p) * (j + 0.5) / n;
  }
  EXPECT_NEAR(AnnealTarget(p, q, n, n), n * (p + q) / 2, 1e-12);  // the mean weight, n times
}

TEST(AnnealIndex, MovesItsMixtureFromTheFirstWeightsToTheSecond) {
  const int64_t n = 1000;
  std::vector<uint16_t> index(n);
  BuildAnnealIndex({1.0, 0.0}, {0.0, 1.0}, n, index.data());
  int first_quarter = 0, last_quarter = 0;
  for (int64_t i = 0; i < n / 4; ++i) first_quarter += index[i] == 1;
  for (int64_t i = 3 * n / 4; i < n; ++i) last_quarter += index[i] == 1;
  EXPECT_NEAR(first_quarter, 0.125 * n / 4 * 1.0, 2);  // mean weight of dataset 1: 1/8 there
  EXPECT_NEAR(last_quarter, 0.875 * n / 4 * 1.0, 2);   // and 7/8 here
}

struct Staged {
  std::vector<uint16_t> index;
  std::vector<int64_t> sample;
};

Staged BuildStaged(const std::vector<StageMixture>& stages) {
  int64_t n = 0;
  for (const StageMixture& s : stages) n += s.samples;
  Staged out{std::vector<uint16_t>(n), std::vector<int64_t>(n)};
  BuildStagedBlendIndex(stages, out.index.data(), out.sample.data());
  return out;
}

TEST(StagedBlendIndex, EachStageAfterItsAnnealIsWithinOneSampleOfItsWeightsAtEveryPrefix) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int datasets = 2 + static_cast<int>(rng() % 5);
    std::vector<StageMixture> stages(1 + rng() % 3);
    for (size_t k = 0; k < stages.size(); ++k) {
      stages[k].samples = 1 + static_cast<int64_t>(rng() % 400);
      stages[k].anneal_samples = k == 0 ? 0 : static_cast<int64_t>(rng() % (stages[k].samples + 1));
      stages[k].weights = RandomShares(rng, datasets, true);
      for (double& w : stages[k].weights) w *= 3;  // raw weights: only their ratios count
    }
    const Staged staged = BuildStaged(stages);
    std::vector<int64_t> running(datasets, 0);
    std::vector<double> previous;
    int64_t at = 0;
    for (const StageMixture& stage : stages) {
      double total = 0;
      for (double w : stage.weights) total += w;
      std::vector<double> share;
      for (double w : stage.weights) share.push_back(w / total);
      const int64_t anneal = stage.anneal_samples;
      if (anneal > 0) {
        const std::vector<uint16_t> part(staged.index.begin() + at,
                                         staged.index.begin() + at + anneal);
        ASSERT_LT(WorstAnnealError(previous, share, anneal, part), 1.0 + 1e-9) << trial;
      }
      std::vector<int64_t> taken(datasets, 0);
      for (int64_t m = 0; m < stage.samples - anneal; ++m) {
        const int64_t i = at + anneal + m;
        const int d = staged.index[i];
        ASSERT_GT(stage.weights[d], 0) << "a dataset the stage does not list";
        ++taken[d];
        for (int e = 0; e < datasets; ++e)
          ASSERT_LT(std::abs(taken[e] - (m + 1) * share[e]), 1.0 + 1e-9)
              << "trial " << trial << " sample " << i << " dataset " << e;
      }
      // Running numbers go on across stages: dataset d's k-th sample of the run is number k.
      for (int64_t i = at; i < at + stage.samples; ++i)
        ASSERT_EQ(staged.sample[i], running[staged.index[i]]++);
      previous = share;
      at += stage.samples;
    }
  }
}

TEST(StagedBlendIndex, OneStageIsThePlainBlendIndex) {
  const std::vector<double> weights = {5, 3, 2, 0.25};
  const int64_t n = 5000;
  std::vector<uint16_t> index(n);
  std::vector<int64_t> sample(n);
  BuildBlendIndex(weights, n, index.data(), sample.data());
  const Staged staged = BuildStaged({{n, 0, weights}});
  EXPECT_EQ(staged.index, index);
  EXPECT_EQ(staged.sample, sample);
}

// A staged blend opened on real shards.
class StagedBlendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeShard(dir_ / "a", LetterDocs(0, 200, 1));
    MakeShard(dir_ / "b", LetterDocs(1, 60, 2));
    MakeShard(dir_ / "c", LetterDocs(2, 80, 3));
    AtomicWriteFile(dir_ / "one.txt", "5 a web\n3 b books\n");
    AtomicWriteFile(dir_ / "two.txt", "1 c code\n3 a web\n");
  }
  BlendOptions Options(std::vector<BlendStageOptions> stages) const {
    BlendOptions o;
    o.stages = std::move(stages);
    for (const auto& s : o.stages) o.num_samples += s.samples;
    o.seq_len = 16;
    o.seed = 99;
    o.progress = false;
    return o;
  }
  ScratchDir dir_;
};

TEST_F(StagedBlendTest, AShardIsOneDatasetAcrossStagesAndEachStageKeepsItsMixture) {
  auto blend = BlendedDataset::Open(Options(
      {{"first", dir_ / "one.txt", "s1", 400, 0}, {"second", dir_ / "two.txt", "s2", 800, 120}}));
  ASSERT_EQ(blend->shards().size(), 3u);  // a, b, c: `a` in both lists is one dataset
  ASSERT_EQ(blend->stages().size(), 2u);
  EXPECT_EQ(blend->stages()[1].datasets, (std::vector<int>{2, 0}));
  const std::vector<StageMixtureReport> reports = RealisedStageMixtures(*blend);
  ASSERT_EQ(reports.size(), 2u);
  for (const StageMixtureReport& r : reports)
    for (const StageDatasetMixture& d : r.datasets) {
      EXPECT_LT(d.max_error, 1.0 + 1e-9) << r.name << " " << d.corpus;
      EXPECT_LT(d.anneal_max_error, 1.0 + 1e-9) << r.name << " " << d.corpus;
    }
  // Stage 2 anneals out `books` (b): it appears in the anneal only.
  const StageMixtureReport& second = reports[1];
  ASSERT_EQ(second.datasets.size(), 3u);
  EXPECT_EQ(second.datasets[2].corpus, "books");
  EXPECT_EQ(second.datasets[2].weight, 0);
  EXPECT_GT(second.datasets[2].anneal_taken, 0);
  EXPECT_EQ(second.datasets[2].taken, 0);
  EXPECT_EQ(second.datasets[0].taken + second.datasets[1].taken, 800 - 120);
  // `web` goes on through its samples in stage 2 instead of starting over.
  int64_t web_in_first = 0;
  for (int64_t i = 0; i < 400; ++i) web_in_first += blend->Origin(i).dataset == 0;
  for (int64_t i = 400; i < 1200; ++i)
    if (blend->Origin(i).dataset == 0) {
      EXPECT_EQ(blend->Origin(i).position, web_in_first);
      break;
    }
}

TEST_F(StagedBlendTest, OneStageReadsTheSamplesOfThePlainBlendOfItsList) {
  auto staged = BlendedDataset::Open(Options({{"only", dir_ / "one.txt", "s1", 300, 0}}));
  BlendOptions plain = Options({});
  plain.file_list = dir_ / "one.txt";
  plain.num_samples = 300;
  auto blend = BlendedDataset::Open(plain);
  std::vector<int32_t> a(17), b(17);
  for (int64_t i = 0; i < 300; ++i) {
    staged->Sample(i, a.data());
    blend->Sample(i, b.data());
    ASSERT_EQ(a, b) << "sample " << i;
  }
}

TEST_F(StagedBlendTest, AStageListingOneShardTwiceIsBadDataNamingTheLines) {
  AtomicWriteFile(dir_ / "twice.txt", "1 a\n2 c\n1 a.bin\n");
  try {
    BlendedDataset::Open(Options({{"x", dir_ / "twice.txt", "s1", 10, 0}}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("twice.txt:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("twice.txt:1"), std::string::npos) << e.what();
  }
}

TEST_F(StagedBlendTest, ABlendOfBlendsWeighsEachListsLinesByItsShareAndAddsASharedShard) {
  // one.txt: a 5/8, b 3/8; two.txt: c 1/4, a 3/4. At 0.6 and 0.4: a 0.375 + 0.3, b 0.225, c 0.1.
  BlendStageOptions stage{"mix", "", "s1", 1000, 0};
  stage.blends = {{dir_ / "one.txt", 0.6}, {dir_ / "two.txt", 0.4}};
  auto blend = BlendedDataset::Open(Options({stage}));
  ASSERT_EQ(blend->shards().size(), 3u);
  const BlendStage& opened = blend->stages()[0];
  EXPECT_EQ(opened.datasets, (std::vector<int>{0, 1, 2}));  // a once, where one.txt names it
  EXPECT_EQ(opened.entries[0].where, dir_ / "one.txt:1");
  const std::vector<double> expected = {0.675, 0.225, 0.1};
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(opened.shares[d], expected[d], 1e-12) << d;
  const StageMixtureReport report = RealisedStageMixtures(*blend)[0];
  for (const StageDatasetMixture& d : report.datasets) {
    EXPECT_LT(d.max_error, 1.0 + 1e-9) << d.corpus;
    EXPECT_NEAR(static_cast<double>(d.taken), 1000 * expected[d.dataset], 1.0) << d.corpus;
  }
  // The blend weights are relative: 3 and 2 are 0.6 and 0.4.
  stage.blends = {{dir_ / "one.txt", 3}, {dir_ / "two.txt", 2}};
  auto scaled = BlendedDataset::Open(Options({stage}));
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(scaled->stages()[0].shares[d], expected[d], 1e-12) << d;
  // One list alone in a blend of blends is that list's blend.
  stage.blends = {{dir_ / "one.txt", 0.25}};
  auto alone = BlendedDataset::Open(Options({stage}));
  auto plain = BlendedDataset::Open(Options({{"plain", dir_ / "one.txt", "s1", 1000, 0}}));
  for (int64_t i = 0; i < 1000; ++i)
    ASSERT_EQ(alone->Origin(i).dataset, plain->Origin(i).dataset) << i;
}

TEST_F(StagedBlendTest, ABlendListWithBadContentFailsAsABadListDoesNamingTheStage) {
  AtomicWriteFile(dir_ / "bad.txt", "1 a\n-2 c\n");
  AtomicWriteFile(dir_ / "twice.txt", "1 a\n2 c\n1 a.bin\n");
  for (const std::string list : {"bad.txt", "twice.txt"}) {
    BlendStageOptions stage{"mix", "", "run.toml:3: [[data.stages]] #1 (\"mix\")", 10, 0};
    stage.blends = {{dir_ / "one.txt", 1}, {dir_ / list, 1}};
    try {
      BlendedDataset::Open(Options({stage}));
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitBadData) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir_ / list + ":"), std::string::npos) << e.what();
      if (list == "bad.txt")
        EXPECT_EQ(std::string(e.what()).rfind("run.toml:3: [[data.stages]] #1 (\"mix\"): ", 0), 0u)
            << e.what();
    }
  }
}

TEST_F(StagedBlendTest, TheCacheKeyNamesTheStagesNotThePaths) {
  auto first = BlendedDataset::Open(Options(
      {{"first", dir_ / "one.txt", "s1", 100, 0}, {"second", dir_ / "two.txt", "s2", 100, 10}}));
  auto other = BlendedDataset::Open(Options(
      {{"first", dir_ / "one.txt", "s1", 100, 0}, {"second", dir_ / "two.txt", "s2", 100, 20}}));
  EXPECT_NE(first->cache_path(), other->cache_path());  // another anneal: another index
  EXPECT_EQ(first->cache_key().find(dir_.path()), std::string::npos);
}

}  // namespace
}  // namespace crucible
