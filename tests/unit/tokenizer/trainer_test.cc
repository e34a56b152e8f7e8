// Training: vocabulary size, special tokens, round trips, determinism across thread counts.
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

std::vector<std::string> RandomCorpus(uint64_t seed, int documents) {
  std::mt19937_64 rng(seed);
  const char* words[] = {"the",  "of",     "and", "tokenizer", "merge", "pair",  "Straße", "naïve",
                         "東京", "データ", "🎉",   "1234",      "it's",  "WE'LL", "\n",     "  ",
                         "x",    "qu",     "ing", "tion",      "re",    "co",    "de",     ","};
  std::vector<std::string> docs;
  for (int d = 0; d < documents; ++d) {
    std::string doc;
    for (int w = 0, n = 5 + rng() % 80; w < n; ++w) {
      doc += words[rng() % 24];
      if (rng() % 3) doc += ' ';
    }
    docs.push_back(doc);
  }
  return docs;
}

Tokenizer TrainOn(const std::vector<std::string>& docs, TokenizerTrainOptions options) {
  TokenizerTrainer trainer(options);
  std::vector<std::string_view> views(docs.begin(), docs.end());
  trainer.AddDocuments(
      std::vector<std::string_view>(views.begin(), views.begin() + views.size() / 2));
  trainer.AddDocuments(
      std::vector<std::string_view>(views.begin() + views.size() / 2, views.end()));
  return trainer.Train();
}

TEST(Trainer, ReachesTheVocabSizeWithSpecialTokensLast) {
  auto docs = RandomCorpus(1, 400);
  TokenizerTrainOptions options;
  options.vocab_size = 400;
  Tokenizer t = TrainOn(docs, options);
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_EQ(t.bos_id(), 398);
  EXPECT_EQ(t.eos_id(), 399);
  EXPECT_EQ(t.merges_count(), 400 - 256 - 2);
  for (const auto& doc : docs) EXPECT_EQ(t.Decode(t.Encode(doc)), doc);
  // Training compresses: the frequent words are single tokens.
  EXPECT_EQ(t.Encode("tokenizer").size(), 1u);
  EXPECT_EQ(t.Encode("<|end_of_text|>"), std::vector<uint32_t>{399});
}

TEST(Trainer, IsDeterministicAcrossThreadCountsAndStyles) {
  auto docs = RandomCorpus(2, 300);
  for (const char* style : {"llama3", "gpt2"}) {
    TokenizerTrainOptions options;
    options.vocab_size = 360;
    options.pretokenizer = style;
    options.threads = 1;
    std::string one = TrainOn(docs, options).Checksum();
    options.threads = 2;
    EXPECT_EQ(TrainOn(docs, options).Checksum(), one) << style;
    options.threads = 5;
    EXPECT_EQ(TrainOn(docs, options).Checksum(), one) << style;
  }
}

TEST(Trainer, MinFrequencyStopsEarly) {
  std::vector<std::string> docs = {"abababab", "cd"};
  TokenizerTrainOptions options;
  options.vocab_size = 1000;
  options.min_frequency = 2;
  Tokenizer t = TrainOn(docs, options);
  EXPECT_LT(t.vocab_size(), 1000);
  EXPECT_EQ(t.Encode("cd").size(), 2u);  // seen once: never merged
}

TEST(Trainer, SavedFileLoadsBackIdentically) {
  auto docs = RandomCorpus(3, 200);
  TokenizerTrainOptions options;
  options.vocab_size = 320;
  Tokenizer t = TrainOn(docs, options);
  const std::string path = ::testing::TempDir() + "/trained_tokenizer.json";
  t.Save(path);
  Tokenizer back = Tokenizer::Load(path);
  EXPECT_EQ(back.Checksum(), t.Checksum());
  for (const auto& doc : docs) EXPECT_EQ(back.Encode(doc), t.Encode(doc));
}

TEST(Trainer, RejectsAVocabTooSmallForTheBytes) {
  TokenizerTrainOptions options;
  options.vocab_size = 200;
  EXPECT_THROW({ TokenizerTrainer trainer(options); }, Error);
}

}  // namespace
}  // namespace crucible
