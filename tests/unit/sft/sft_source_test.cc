// The SFT data source (sft/sft_source.h): which targets of a rendered ChatML conversation are
// trained (exactly the assistant replies and their <|im_end|>), the piecewise encoding equal to
// encoding the whole text, the sample layout (shift, padding with the end-of-turn id), the seeded
// order, overlong conversations truncated or skipped, and the one-line errors naming file:line.
#include "sft/sft_source.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/error.h"
#include "support/tiny_training.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

Tokenizer ChatmlTokenizer() {
  TokenizerTrainOptions options;
  options.vocab_size = 300;
  options.min_frequency = 1;
  options.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  TokenizerTrainer trainer(options);
  trainer.AddDocuments(
      {"hello world, the quick brown fox jumps over the lazy dog. user assistant "
       "system what is a fox? a small dog."});
  return trainer.Train();
}

class SftSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test_support::FreshTestFolder("crucible-sft-source");
    tokenizer_ = ChatmlTokenizer();
    tokenizer_path_ = (root_ / "tokenizer.json").string();
    tokenizer_.Save(tokenizer_path_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (root_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  SftOptions Options(const std::string& path, int64_t seq_len) const {
    SftOptions o;
    o.path = path;
    o.chat_template = "chatml";
    o.tokenizer_path = tokenizer_path_;
    o.seq_len = seq_len;
    o.vocab_size = tokenizer_.vocab_size();
    o.seed = 7;
    o.report = false;
    return o;
  }
  std::string ErrorOf(const SftOptions& o) const {
    try {
      MakeSftSource(o);
    } catch (const Error& e) {
      return std::to_string(e.exit_code()) + " " + e.what();
    }
    return "no error";
  }
  fs::path root_;
  Tokenizer tokenizer_;
  std::string tokenizer_path_;
};

TEST_F(SftSourceTest, TrainsExactlyTheAssistantRepliesAndTheirEndOfTurn) {
  const std::vector<ChatMessage> messages = {{"system", "be brief"},
                                             {"user", "what is a fox?"},
                                             {"assistant", "a small dog."},
                                             {"user", "hello"},
                                             {"assistant", "hello world"}};
  const SftTokens t = TokenizeConversation(tokenizer_, "chatml", messages, {}, "test");
  const ChatRendering r = RenderChat("chatml", messages, false, {});
  // Piecewise encoding equals encoding the whole text for ChatML's cuts.
  std::vector<int32_t> whole;
  for (uint32_t id : tokenizer_.Encode(r.text)) whole.push_back(static_cast<int32_t>(id));
  EXPECT_EQ(t.ids, whole);
  // The trained ids decode to the replies, each with its <|im_end|>; the rest to everything else.
  std::vector<uint32_t> trained, other;
  for (size_t i = 0; i < t.ids.size(); ++i)
    (t.trained[i] ? trained : other).push_back(static_cast<uint32_t>(t.ids[i]));
  EXPECT_EQ(tokenizer_.Decode(trained), "a small dog.<|im_end|>hello world<|im_end|>");
  EXPECT_EQ(
      tokenizer_.Decode(other),
      "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwhat is a fox?<|im_end|>\n"
      "<|im_start|>assistant\n\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n\n");
  const int32_t im_end = static_cast<int32_t>(tokenizer_.TokenToId("<|im_end|>"));
  // <|im_end|> after a system or user turn is not trained; after an assistant turn it is.
  int trained_ends = 0;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (t.ids[i] == im_end) trained_ends += t.trained[i];
  EXPECT_EQ(trained_ends, 2);
}

TEST_F(SftSourceTest, LayoutShiftsPadsWithEndOfTurnAndWeighsTargets) {
  SftTokens c;
  c.ids = {5, 6, 7, 8};
  c.trained = {0, 0, 1, 1};
  std::vector<int32_t> tokens(7);
  std::vector<float> weights(6);
  LayoutSftSample(c, 99, 6, tokens.data(), weights.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{5, 6, 7, 8, 99, 99, 99}));
  // Target t predicts id t + 1: ids 2 and 3 are trained, padding is not.
  EXPECT_EQ(weights, (std::vector<float>{0, 1, 1, 0, 0, 0}));
  // Cut at seq_len + 1 tokens.
  std::vector<int32_t> short_tokens(3);
  std::vector<float> short_weights(2);
  LayoutSftSample(c, 99, 2, short_tokens.data(), short_weights.data());
  EXPECT_EQ(short_tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(short_weights, (std::vector<float>{0, 1}));
}

TEST_F(SftSourceTest, PackLayoutRestartsPositionsAndMasksTheBoundaries) {
  SftTokens a, b;
  a.ids = {5, 6, 7};
  a.trained = {0, 1, 1};
  b.ids = {8, 9, 10, 11};
  b.trained = {1, 0, 1, 1};  // b's first token is trained, yet a's last token must not predict it
  std::vector<int32_t> tokens(10), positions(9);
  std::vector<float> weights(9);
  LayoutSftPack({&a, &b}, 99, 9, tokens.data(), weights.data(), positions.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11, 99, 99, 99}));
  EXPECT_EQ(weights, (std::vector<float>{1, 1, 0, 0, 1, 1, 0, 0, 0}));
  // The padding is a document of its own: it attends neither conversation.
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0, 1}));
  // Exactly full: no padding, the last token only a target.
  std::vector<int32_t> full_tokens(7), full_positions(6);
  std::vector<float> full_weights(6);
  LayoutSftPack({&a, &b}, 99, 6, full_tokens.data(), full_weights.data(), full_positions.data());
  EXPECT_EQ(full_tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(full_weights, (std::vector<float>{1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(full_positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
}

TEST_F(SftSourceTest, PackingHoldsEveryConversationOncePerEpochInFewerSamples) {
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "{\"prompt\": \"hello " + std::string(i, 'a') + "\", \"completion\": \"fox\"}\n";
  const std::string path = Write("c.jsonl", text);
  SftOptions o = Options(path, 64);
  auto plain = MakeSftSource(o);
  o.packing = true;
  auto packed = MakeSftSource(o);
  auto again = MakeSftSource(o);
  ASSERT_TRUE(packed->packed());
  ASSERT_FALSE(plain->packed());
  // Every conversation of the unpacked epoch, as token lists.
  std::multiset<std::vector<int32_t>> conversations;
  int64_t plain_padding = 0;
  for (int64_t i = 0; i < 12; ++i) {
    std::vector<int32_t> t(65);
    plain->Sample(i, t.data());
    const int64_t pad = plain->SamplePadding(i);
    plain_padding += pad;
    ASSERT_GT(pad, 0);  // short conversations: each is its inputs before the padding
    conversations.insert(std::vector<int32_t>(t.begin(), t.begin() + 64 - pad));
  }
  // Cut each packed sample at its positions' restarts and compare the pieces.
  std::multiset<std::vector<int32_t>> pieces;
  int64_t samples = 0, packed_padding = 0;
  for (int64_t i = 0; pieces.size() < conversations.size(); ++i, ++samples) {
    ASSERT_LT(i, 12) << "packing must not need more samples than conversations";
    std::vector<int32_t> t(65), p(64), t2(65), p2(64);
    packed->Sample(i, t.data());
    packed->SamplePositions(i, p.data());
    again->Sample(i, t2.data());
    again->SamplePositions(i, p2.data());
    EXPECT_EQ(t, t2);
    EXPECT_EQ(p, p2);
    const int64_t pad = packed->SamplePadding(i);
    packed_padding += pad;
    for (int64_t start = 0; start < 64 - pad;) {
      int64_t end = start + 1;
      while (end < 64 - pad && p[end] != 0) ++end;
      pieces.insert(std::vector<int32_t>(t.begin() + start, t.begin() + end));
      start = end;
    }
  }
  EXPECT_EQ(pieces, conversations);
  EXPECT_LT(samples, 12);
  EXPECT_LT(packed_padding, plain_padding);
  // The packs repeat every epoch.
  std::vector<int32_t> first(65), wrap(65);
  packed->Sample(0, first.data());
  packed->Sample(samples, wrap.data());
  EXPECT_EQ(first, wrap);
}

TEST_F(SftSourceTest, SamplesArePureAndEveryConversationAppearsOncePerEpoch) {
  std::string text;
  for (int i = 0; i < 5; ++i)
    text += "{\"prompt\": \"hello " + std::string(i, 'a') + "\", \"completion\": \"fox\"}\n";
  const std::string path = Write("c.jsonl", text);
  auto source = MakeSftSource(Options(path, 32));
  auto again = MakeSftSource(Options(path, 32));
  ASSERT_TRUE(source->weighted());
  std::set<std::vector<int32_t>> epoch;
  for (int64_t i = 0; i < 10; ++i) {
    std::vector<int32_t> a(33), b(33), wrap(33);
    std::vector<float> wa(32), wb(32);
    source->Sample(i, a.data());
    again->Sample(i, b.data());
    source->SampleWeights(i, wa.data());
    again->SampleWeights(i, wb.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(wa, wb);
    source->Sample(i + 5, wrap.data());  // the same order every epoch
    EXPECT_EQ(a, wrap);
    if (i < 5) epoch.insert(a);
  }
  EXPECT_EQ(epoch.size(), 5u);
}

TEST_F(SftSourceTest, OverlongConversationsAreTruncatedOrSkipped) {
  // Unmerged letters: one token per byte, so these are far beyond seq_len + 1 = 41 tokens.
  std::string longer;
  for (int i = 0; i < 30; ++i) longer += "zq ";
  const std::string path =
      Write("c.jsonl",
            "{\"prompt\": \"hi\", \"completion\": \"fox\"}\n"
            "{\"prompt\": \"hi\", \"completion\": \"" +
                longer + "\"}\n{\"prompt\": \"" + longer + "\", \"completion\": \"fox\"}\n");
  SftOptions o = Options(path, 40);
  auto truncated = MakeSftSource(o);
  EXPECT_NE(truncated->Describe().find("2 conversations"), std::string::npos);  // third: no reply
  o.overlong = "skip";
  auto skipped = MakeSftSource(o);
  EXPECT_NE(skipped->Describe().find("1 conversations"), std::string::npos);
  o.overlong = "drop";
  EXPECT_NE(ErrorOf(o).find("2 sft.overlong: expected truncate or skip"), std::string::npos);
}

TEST_F(SftSourceTest, BadInputIsOneLineNamingFileAndLine) {
  auto error = [&](const std::string& text) {
    return ErrorOf(Options(Write("bad.jsonl", text), 32));
  };
  const std::string file = (root_ / "bad.jsonl").string();
  EXPECT_EQ(error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"),
            "65 " + file +
                ":1: the conversation has no assistant message, so nothing in it would be "
                "trained: add the reply or remove the line");
  EXPECT_EQ(
      error("{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"messages\": [{\"role\": "
            "\"robot\", \"content\": \"hi\"}]}\n"),
      "65 " + file + ":3: message 0: unknown role 'robot' (expected system, user or assistant)");
  EXPECT_NE(error("{\"prompt\": \"a\"\n").find("65 " + file + ":1: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error("[1, 2]\n").find("65 " + file + ":1: not a JSON object"), std::string::npos);
  EXPECT_NE(error("\n\n").find("65 " + file + ": no conversations"), std::string::npos);
  SftOptions o = Options(Write("ok.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n"), 32);
  o.chat_template = "vicuna";
  EXPECT_NE(ErrorOf(o).find("2 "), std::string::npos);
  EXPECT_NE(ErrorOf(o).find("vicuna"), std::string::npos);
  o.chat_template = "llama3";  // the tokenizer lacks its markers
  EXPECT_NE(ErrorOf(o).find("<|start_header_id|>"), std::string::npos);
}

}  // namespace
}  // namespace crucible
