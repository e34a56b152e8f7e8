#include "data/blended_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/error.h"
#include "common/files.h"
#include "data/indexed_dataset.h"
#include "data/loader.h"
#include "data_test_util.h"

namespace crucible {
namespace {

using testing::ByteEncoder;
using testing::LetterDocs;
using testing::MakeShard;
using testing::ScratchDir;

constexpr int64_t kSeqLen = 16;

// Three shards of different sizes, blended 5:3:2.
class BlendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeShard(dir_ / "a", LetterDocs(0, 200, 1));
    MakeShard(dir_ / "b", LetterDocs(1, 60, 2));
    MakeShard(dir_ / "c", LetterDocs(2, 15, 3));
    WriteList("5 a web\n3 b.bin books\n# comment\n\n2 c\n");
  }
  void WriteList(const std::string& text) { AtomicWriteFile(list(), text); }
  std::string list() const { return dir_ / "blend.txt"; }
  BlendOptions Options(int64_t samples, uint64_t seed = 1234) const {
    BlendOptions o;
    o.file_list = list();
    o.seq_len = kSeqLen;
    o.seed = seed;
    o.num_samples = samples;
    o.progress = false;
    return o;
  }
  std::vector<int32_t> Stream(const BlendedDataset& blend, int64_t first, int64_t count) {
    std::vector<int32_t> out(count * (kSeqLen + 1));
    for (int64_t i = 0; i < count; ++i) blend.Sample(first + i, out.data() + i * (kSeqLen + 1));
    return out;
  }
  // A loader's batch as the samples it was read from: each row's inputs, then its last target.
  static std::vector<int32_t> Samples(const Batch& batch) {
    std::vector<int32_t> out;
    for (int64_t s = 0; s < batch.samples; ++s) {
      out.insert(out.end(), batch.inputs_at(s), batch.inputs_at(s) + batch.seq_len);
      out.push_back(batch.targets_at(s)[batch.seq_len - 1]);
      EXPECT_TRUE(std::equal(batch.inputs_at(s) + 1, batch.inputs_at(s) + batch.seq_len,
                             batch.targets_at(s)))
          << "targets are the inputs shifted by one";
    }
    EXPECT_TRUE(batch.loss_weights.empty()) << "a blend weighs every target 1";
    return out;
  }
  // Error (exit code, message) of opening the blend.
  std::pair<int, std::string> OpenError(int64_t vocab_size = 0) {
    BlendOptions o = Options(100);
    o.vocab_size = vocab_size;
    try {
      BlendedDataset::Open(o);
    } catch (const Error& e) {
      return {e.exit_code(), e.what()};
    }
    return {0, ""};
  }
  ScratchDir dir_;
};

TEST_F(BlendTest, SamplesAreWindowsOfTheirOwnDataset) {
  auto blend = BlendedDataset::Open(Options(600));
  ASSERT_EQ(blend->size(), 600);
  std::vector<int32_t> tokens(kSeqLen + 1);
  std::vector<int64_t> per_dataset(3, 0);
  for (int64_t i = 0; i < blend->size(); ++i) {
    blend->Sample(i, tokens.data());
    const SampleOrigin origin = blend->Origin(i);
    ++per_dataset[origin.dataset];
    for (int32_t t : tokens) {
      const bool letter = t >= 'a' && t <= 'z';
      EXPECT_TRUE(!letter || t == 'a' + origin.dataset) << "sample " << i << " mixes datasets";
      EXPECT_TRUE(letter || t == ' ' || (t >= '0' && t <= '9') || t == 256) << t;
    }
  }
  EXPECT_EQ(per_dataset, (std::vector<int64_t>{300, 180, 120}));
  // The small shard c is read over several epochs (its documents reshuffled each time).
  EXPECT_GT(blend->Origin(599).epoch + blend->Origin(598).epoch, 0);
}

TEST_F(BlendTest, EpochCoversEveryWindowOnce) {
  auto blend = BlendedDataset::Open(Options(600));
  const BlendedShard& c = blend->shards()[2];
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t i = 0; i < blend->size(); ++i) {
    SampleOrigin o = blend->Origin(i);
    if (o.dataset != 2) continue;
    EXPECT_LT(o.window, c.samples_per_epoch);
    EXPECT_TRUE(seen.insert({o.epoch, o.window}).second) << "window used twice in an epoch";
  }
}

TEST_F(BlendTest, PrefixStableAcrossLongerRunsAndCacheRebuilds) {
  auto short_run = BlendedDataset::Open(Options(300));
  const std::vector<int32_t> first = Stream(*short_run, 0, 300);
  std::filesystem::remove_all(dir_ / ".crucible-cache");
  auto long_run = BlendedDataset::Open(Options(600));
  EXPECT_EQ(Stream(*long_run, 0, 300), first);
  auto reread = BlendedDataset::Open(Options(450));  // served from the 600-sample cache
  EXPECT_EQ(Stream(*reread, 0, 300), first);
}

TEST_F(BlendTest, OrderDependsOnTheSeed) {
  auto one = BlendedDataset::Open(Options(200, 1));
  auto two = BlendedDataset::Open(Options(200, 2));
  EXPECT_NE(Stream(*one, 0, 200), Stream(*two, 0, 200));
  EXPECT_NE(one->cache_path(), two->cache_path());
}

TEST_F(BlendTest, EveryWorldSizeSeesTheSameGlobalStream) {
  auto blend = BlendedDataset::Open(Options(240));
  const int64_t global_batch = 12, batches = 20;
  const std::vector<int32_t> reference = Stream(*blend, 0, global_batch * batches);
  for (int world : {1, 2, 3, 4}) {
    std::vector<int32_t> stitched(reference.size());
    for (int rank = 0; rank < world; ++rank) {
      DataLoader loader(*blend, kSeqLen, global_batch, rank, world, 0);
      for (int64_t k = 0; k < batches; ++k) {
        const std::vector<int32_t> part = Samples(loader.Next());
        const RankSlice slice = SliceOfBatch(k * global_batch, global_batch, rank, world);
        std::copy(part.begin(), part.end(), stitched.begin() + slice.first_sample * (kSeqLen + 1));
      }
      EXPECT_EQ(loader.consumed_samples(), global_batch * batches);
    }
    EXPECT_EQ(stitched, reference) << "world size " << world;
  }
}

TEST_F(BlendTest, ResumesFromAnyConsumedCount) {
  auto blend = BlendedDataset::Open(Options(240));
  const int64_t global_batch = 8;
  for (int64_t consumed : {0, 8, 16, 40, 13, 1}) {
    DataLoader loader(*blend, kSeqLen, global_batch, 0, 1, consumed);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(Samples(loader.Next()), Stream(*blend, consumed + k * global_batch, global_batch))
          << "resumed at " << consumed;
    }
  }
}

TEST_F(BlendTest, CacheKeyIsContentNotPath) {
  auto first = BlendedDataset::Open(Options(100));
  // The same shards under other names give the same key.
  for (const char* name : {"a", "b", "c"})
    for (const char* ext : {".bin", ".idx", ".manifest.json"})
      std::filesystem::copy_file(dir_ / (std::string(name) + ext),
                                 dir_ / (std::string("copy_") + name + ext));
  WriteList("5 copy_a web\n3 copy_b books\n2 copy_c\n");
  auto copied = BlendedDataset::Open(Options(100));
  EXPECT_EQ(copied->cache_key(), first->cache_key());
  // Re-preparing a shard with other content changes the key.
  MakeShard(dir_ / "copy_c", LetterDocs(2, 16, 9));
  auto changed = BlendedDataset::Open(Options(100));
  EXPECT_NE(changed->cache_key(), first->cache_key());
}

TEST_F(BlendTest, DetectsAndNamesAShardChangedAfterPrepare) {
  {
    // Same size, different bytes: caught by the checksum the first time a sample is read.
    std::string bin = ReadFile(dir_ / "b.bin");
    bin[10] = 'z';
    std::ofstream(dir_ / "b.bin", std::ios::binary | std::ios::trunc) << bin;
    auto blend = BlendedDataset::Open(Options(50));
    std::vector<int32_t> tokens(kSeqLen + 1);
    bool failed = false;
    for (int64_t i = 0; i < 50 && !failed; ++i) {
      try {
        blend->Sample(i, tokens.data());
      } catch (const Error& e) {
        failed = true;
        EXPECT_EQ(blend->Origin(i).dataset, 1);
        EXPECT_EQ(e.exit_code(), kExitBadData);
        EXPECT_NE(std::string(e.what()).find("b.bin"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("blend.txt:2"), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(failed);
  }
  // Appended to: caught on open by the size check.
  std::ofstream(dir_ / "a.bin", std::ios::binary | std::ios::app) << "xx";
  auto [code, message] = OpenError();
  EXPECT_EQ(code, kExitBadData);
  EXPECT_NE(message.find("a.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("blend.txt:1"), std::string::npos) << message;
}

TEST_F(BlendTest, BadInputNamesTheListLine) {
  auto expect = [&](const std::string& list, const std::string& needle, int64_t vocab = 0) {
    WriteList(list);
    auto [code, message] = OpenError(vocab);
    EXPECT_EQ(code, kExitBadData) << list << " -> " << message;
    EXPECT_NE(message.find(needle), std::string::npos) << list << " -> " << message;
  };
  expect("5 a\n1 missing\n", "blend.txt:2: " + (dir_ / "missing.bin") + ": no such file");
  expect("0 a\n", "blend.txt:1: weight 0 must be a positive");
  expect("5 a\n-2 b\n", "blend.txt:2: weight -2 must be a positive");
  expect("x a\n", "blend.txt:1: weight 'x' is not a number");
  expect("1e308 a\n1e-10 b\n", "blend.txt:2: weight 1e-10 is too small next to the largest");
  expect("1 a web extra\n", "blend.txt:1: expected");
  expect("# nothing\n", "names no datasets");
  expect("1 a\n1 b\n", "vocabulary overflow", 200);  // byte ids reach 256
  // A .bin/.idx pair that prepare did not make (no manifest).
  std::filesystem::copy_file(dir_ / "a.bin", dir_ / "stray.bin");
  std::filesystem::copy_file(dir_ / "a.idx", dir_ / "stray.idx");
  expect("1 stray\n", "blend.txt:1: " + (dir_ / "stray") + ": unknown corpus file");
  // An empty corpus (fewer tokens than one sample).
  MakeShard(dir_ / "tiny", {"x"});
  expect("1 a\n1 tiny\n", "blend.txt:2: " + (dir_ / "tiny") + ": empty corpus");
  // Damaged index files.
  WriteList("1 a\n2 b\n");
  const std::string idx = ReadFile(dir_ / "b.idx");
  std::string magic = idx;
  magic[1] = 'X';
  std::ofstream(dir_ / "b.idx", std::ios::binary | std::ios::trunc) << magic;
  expect("1 a\n2 b\n", "wrong magic");
  std::ofstream(dir_ / "b.idx", std::ios::binary | std::ios::trunc)
      << idx.substr(0, idx.size() - 8);
  expect("1 a\n2 b\n", "truncated");
}

TEST_F(BlendTest, WeightsWhoseSumOverflowsBlendLikeTheirRatios) {
  WriteList("1 a\n1 b\n");
  auto unit = BlendedDataset::Open(Options(400));
  WriteList("1e308 a\n1e308 b\n");
  auto huge = BlendedDataset::Open(Options(400));
  ASSERT_EQ(huge->shards().size(), 2u);
  EXPECT_EQ(huge->shards()[0].share, 0.5);
  EXPECT_EQ(huge->shards()[1].share, 0.5);
  EXPECT_EQ(Stream(*huge, 0, 400), Stream(*unit, 0, 400));
}

TEST_F(BlendTest, AnIndexTooLargeForMemoryIsRefusedNamingTheRequest) {
  BlendOptions o = Options(int64_t{1} << 60);
  o.samples_from = "--samples 1152921504606846976";
  try {
    BlendedDataset::Open(o);
    ADD_FAILURE() << "opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_EQ(std::string(e.what()).find("--samples 1152921504606846976 needs 10.0 EiB of blend "
                                         "index (10 bytes a sample, 20.0 EiB while it is built"),
              0u)
        << e.what();
  }
}

TEST_F(BlendTest, DtypeMismatchBetweenIndexAndManifest) {
  // Rewrite b as int32 under its old manifest (which says uint16): sizes differ, so hide that by
  // patching the manifest sizes to the new files, leaving only the dtype wrong.
  auto data = std::make_unique<IndexedDataset>(dir_ / "b");
  std::vector<std::vector<uint32_t>> docs;
  for (int64_t s = 0; s < data->sequence_count(); ++s) {
    auto seq = data->Sequence(s);
    docs.emplace_back(seq.begin(), seq.end());
  }
  data.reset();
  {
    IndexedDatasetWriter writer(dir_ / "b", TokenDtype::kInt32);
    for (const auto& d : docs) writer.AddDocument(d.data(), d.size(), "b");
    writer.Commit();
  }
  ShardManifest m = ReadManifest(dir_ / "b");
  m.bin.bytes = static_cast<int64_t>(std::filesystem::file_size(dir_ / "b.bin"));
  WriteManifest(dir_ / "b", m);
  auto [code, message] = OpenError();
  EXPECT_EQ(code, kExitBadData);
  EXPECT_NE(message.find("dtype mismatch"), std::string::npos) << message;
  EXPECT_NE(message.find("blend.txt:2"), std::string::npos) << message;
}

TEST(ShufflePosition, IsABijectionForAwkwardSizes) {
  for (uint64_t size : {1ull, 2ull, 3ull, 5ull, 64ull, 65ull, 1000ull, 4097ull}) {
    std::set<uint64_t> images;
    for (uint64_t i = 0; i < size; ++i) {
      uint64_t y = ShufflePosition(i, size, 42, 7);
      EXPECT_LT(y, size);
      images.insert(y);
    }
    EXPECT_EQ(images.size(), size);
  }
  // Not the identity, and different streams differ.
  int moved = 0, differ = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    moved += ShufflePosition(i, 1000, 42, 7) != i;
    differ += ShufflePosition(i, 1000, 42, 7) != ShufflePosition(i, 1000, 42, 8);
  }
  EXPECT_GT(moved, 900);
  EXPECT_GT(differ, 900);
}

}  // namespace
}  // namespace crucible
