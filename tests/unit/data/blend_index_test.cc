#include "data/blend_index.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "data_test_util.h"

namespace crucible {
namespace {

using testing::ScratchDir;

std::vector<double> RandomWeights(std::mt19937_64& rng, int datasets) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int power = 1 + static_cast<int>(rng() % 5);  // skewed mixes too
  std::vector<double> w(datasets);
  for (auto& x : w) x = std::pow(u(rng), power) + 1e-4;
  return w;
}

BlendIndex Build(const std::vector<double>& weights, int64_t n) {
  BlendIndex index;
  index.dataset_index.resize(n);
  index.dataset_sample.resize(n);
  BuildBlendIndex(weights, n, index.dataset_index.data(), index.dataset_sample.data());
  return index;
}

// The same quota method written the slow, obvious way: scan every dataset every step.
std::vector<uint16_t> QuotaMethodReference(const std::vector<double>& weights, int64_t n) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<double> share;
  for (double w : weights) share.push_back(w / total);
  std::vector<int64_t> taken(weights.size(), 0);
  std::vector<uint16_t> out;
  for (int64_t step = 0; step < n; ++step) {
    int best = -1;
    double best_due = 0;
    for (size_t d = 0; d < weights.size(); ++d) {
      if (std::floor(taken[d] / share[d]) > static_cast<double>(step)) continue;  // upper quota
      double due = (taken[d] + 1) / share[d];
      if (best < 0 || due < best_due) {
        best = static_cast<int>(d);
        best_due = due;
      }
    }
    out.push_back(static_cast<uint16_t>(best));
    ++taken[best];
  }
  return out;
}

TEST(BlendIndex, EveryPrefixIsWithinOneSampleOfTheWeights) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int datasets = 1 + static_cast<int>(rng() % 60);
    const std::vector<double> weights = RandomWeights(rng, datasets);
    double total = 0;
    for (double w : weights) total += w;
    const int64_t n = 3000;
    BlendIndex index = Build(weights, n);
    std::vector<int64_t> taken(datasets, 0);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int d = index.dataset_index[i];
      ASSERT_EQ(index.dataset_sample[i], taken[d]) << "running sample number";
      ++taken[d];
      for (int k = 0; k < datasets; ++k)
        worst = std::max(worst, std::abs(taken[k] - (i + 1) * weights[k] / total));
    }
    EXPECT_LE(worst, 1.0) << "trial " << trial << " with " << datasets << " datasets";
  }
}

TEST(BlendIndex, MatchesTheQuotaMethodComputedByBruteForce) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<double> weights = RandomWeights(rng, 1 + static_cast<int>(rng() % 40));
    const int64_t n = 2000;
    EXPECT_EQ(Build(weights, n).dataset_index, QuotaMethodReference(weights, n)) << trial;
  }
}

TEST(BlendIndex, PrefixStableWhenAskedForMoreSamples) {
  std::mt19937_64 rng(3);
  const std::vector<double> weights = RandomWeights(rng, 17);
  BlendIndex short_run = Build(weights, 5000), long_run = Build(weights, 10000);
  EXPECT_TRUE(std::equal(short_run.dataset_index.begin(), short_run.dataset_index.end(),
                         long_run.dataset_index.begin()));
  EXPECT_TRUE(std::equal(short_run.dataset_sample.begin(), short_run.dataset_sample.end(),
                         long_run.dataset_sample.begin()));
}

TEST(BlendIndex, TinyWeightsGetTheirQuotaExactly) {
  // A dataset with a share of 2.7e-7: its next sample is due millions of steps apart, beyond the
  // calendar ring's reach.
  const std::vector<double> weights = {1.0, 4e-7, 0.5};
  const int64_t n = 4000000;
  BlendIndex index = Build(weights, n);
  int64_t rare = 0;
  for (uint16_t d : index.dataset_index) rare += d == 1;
  EXPECT_EQ(rare, 1);  // 4e6 * 4e-7 / 1.5000004 = 1.07: between floor 1 and ceil 2, due at 3.75e6
  EXPECT_EQ(index.dataset_index, QuotaMethodReference(weights, n));
}

TEST(BlendIndex, WeightsWhoseSumOverflowsGiveTheSameIndexAsTheirRatios) {
  // Each weight is finite but their sum is not: 2^1023 + 2^1023 + 2^1022 overflows a double.
  const std::vector<double> huge = {0x1p1023, 0x1p1023, 0x1p1022};
  const int64_t n = 5000;
  EXPECT_EQ(Build(huge, n).dataset_index, Build({2, 2, 1}, n).dataset_index);
  EXPECT_EQ(Build({1e308, 1e308}, n).dataset_index, Build({1, 1}, n).dataset_index);
  const std::vector<double> shares = BlendShares({1e308, 1e308});
  EXPECT_EQ(shares, std::vector<double>({0.5, 0.5}));
}

TEST(BlendIndex, SharesThatCannotBeRepresentedAreBadDataNamingTheWeight) {
  auto error = [](const std::vector<double>& weights) -> std::pair<int, std::string> {
    try {
      BlendShares(weights, {"list.txt:1", "list.txt:2", "list.txt:3"});
    } catch (const Error& e) {
      return {e.exit_code(), e.what()};
    }
    return {0, ""};
  };
  // 1e-10 next to 1e308: a share of 1e-318 is below the smallest normal double.
  auto [code, message] = error({1e308, 1e-10});
  EXPECT_EQ(code, kExitBadData);
  EXPECT_NE(message.find("list.txt:2"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot be represented"), std::string::npos) << message;
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    auto [bad_code, bad_message] = error({1.0, 1.0, bad});
    EXPECT_EQ(bad_code, kExitBadData) << bad;
    EXPECT_NE(bad_message.find("list.txt:3"), std::string::npos) << bad_message;
  }
  EXPECT_EQ(error({}).first, kExitBadData);
  EXPECT_EQ(error({1.0, 3.0}), (std::pair<int, std::string>{0, ""}));
}

TEST(BlendIndexCache, ReadsBackWhatItBuiltAndServesShorterPrefixes) {
  ScratchDir dir;
  const std::vector<double> weights = {3, 1, 1};
  BlendIndex built = LoadOrBuildBlendIndex(dir.path(), "key-a", weights, 1000, false);
  const std::string path = BlendIndexPath(dir.path(), "key-a");
  ASSERT_TRUE(FileExists(path));
  const std::string bytes = ReadFile(path);
  BlendIndex shorter = LoadOrBuildBlendIndex(dir.path(), "key-a", weights, 400, false);
  EXPECT_EQ(ReadFile(path), bytes) << "a shorter request must not rewrite the cache";
  EXPECT_TRUE(std::equal(shorter.dataset_index.begin(), shorter.dataset_index.end(),
                         built.dataset_index.begin()));
  BlendIndex longer = LoadOrBuildBlendIndex(dir.path(), "key-a", weights, 3000, false);
  EXPECT_GT(ReadFile(path).size(), bytes.size());
  EXPECT_TRUE(std::equal(built.dataset_index.begin(), built.dataset_index.end(),
                         longer.dataset_index.begin()));
  EXPECT_NE(BlendIndexPath(dir.path(), "key-b"), path);
}

TEST(BlendIndexCache, RebuildsACorruptOrTruncatedCacheFile) {
  ScratchDir dir;
  const std::vector<double> weights = {1, 2};
  BlendIndex reference = LoadOrBuildBlendIndex(dir.path(), "k", weights, 500, false);
  const std::string path = BlendIndexPath(dir.path(), "k");
  std::string bytes = ReadFile(path);
  AtomicWriteFile(path, bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(LoadOrBuildBlendIndex(dir.path(), "k", weights, 500, false).dataset_index,
            reference.dataset_index);
  bytes[bytes.size() / 2] ^= 1;
  AtomicWriteFile(path, bytes);
  EXPECT_EQ(LoadOrBuildBlendIndex(dir.path(), "k", weights, 500, false).dataset_index,
            reference.dataset_index);
  EXPECT_EQ(ReadFile(path).size(), bytes.size());
  EXPECT_NE(ReadFile(path), bytes);
}

TEST(BlendIndexCache, ABuilderKilledWhileHoldingTheLockBlocksNobody) {
  ScratchDir dir;
  const std::vector<double> weights = {1, 2};
  const std::string path = BlendIndexPath(dir.path(), "k");
  // A builder that took the lock, had begun writing the index and was killed (SIGKILL, as a
  // crash or an OOM kill ends it): its lock file and its partial temporary file stay on disk.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    const int fd = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    AtomicWriteFile(path + ".tmp.999999", std::string(4096, 'x'));  // stands in for its write
    if (::write(ready[1], "x", 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  char byte;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::kill(holder, SIGKILL);
  int status = 0;
  ::waitpid(holder, &status, 0);
  ASSERT_TRUE(FileExists(path + ".lock"));
  ASSERT_TRUE(FileExists(path + ".tmp.999999"));
  // The flock died with its process: the next builder takes the lock at once, builds, and removes
  // the dead builder's partial file (only a lock holder writes <index>.tmp.<pid>).
  BlendIndex built = LoadOrBuildBlendIndex(dir.path(), "k", weights, 300, false);
  EXPECT_EQ(built.dataset_index, Build(weights, 300).dataset_index);
  EXPECT_FALSE(FileExists(path + ".tmp.999999"));
  EXPECT_TRUE(FileExists(path));
}

TEST(BlendIndexCache, AnIndexBeyondThisMachinesMemoryIsAUsageErrorSaidBeforeAllocating) {
  ScratchDir dir;
  for (const int64_t n : {int64_t{100000000000}, INT64_MAX}) {
    try {
      LoadOrBuildBlendIndex(dir.path(), "k", {1, 1}, n, false, "--samples " + std::to_string(n));
      ADD_FAILURE() << n << " samples were indexed";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
      const std::string message = e.what();
      EXPECT_EQ(message.find("--samples " + std::to_string(n) + " needs "), 0u) << message;
      EXPECT_NE(message.find("of memory"), std::string::npos) << message;
    }
  }
  EXPECT_FALSE(FileExists(BlendIndexPath(dir.path(), "k")));
}

TEST(BlendIndexCache, ConcurrentBuildersInSeveralProcessesAgree) {
  ScratchDir dir;
  std::vector<double> weights(50);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 1.0 + i;
  const int64_t n = 400000;
  BlendIndex reference = Build(weights, n);
  std::vector<pid_t> children;
  for (int p = 0; p < 4; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      BlendIndex got = LoadOrBuildBlendIndex(dir.path(), "shared", weights, n, false);
      ::_exit(got.dataset_index == reference.dataset_index &&
                      got.dataset_sample == reference.dataset_sample
                  ? 0
                  : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Only the cache, its lock file: no temporary left behind.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 2);
}

}  // namespace
}  // namespace crucible
