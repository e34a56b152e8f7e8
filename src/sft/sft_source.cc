#include "sft/sft_source.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/philox.h"
#include "common/strings.h"
#include "launch/environment.h"
#include "launch/rank_environment.h"
#include "sft/chat_template_jinja.h"

namespace crucible {

SftTokens TokenizeConversation(const Tokenizer& tokenizer, const std::string& name,
                               const std::vector<ChatMessage>& messages, const ChatTokens& tokens,
                               const std::string& where) {
  const ChatRendering r = RenderChat(name, messages, false, tokens, where);
  SftTokens out;
  auto encode = [&](size_t begin, size_t end, bool trained) {
    if (end <= begin) return;
    for (uint32_t id : tokenizer.Encode(std::string_view(r.text).substr(begin, end - begin))) {
      out.ids.push_back(static_cast<int32_t>(id));
      out.trained.push_back(trained ? 1 : 0);
    }
  };
  size_t at = 0;
  for (const auto& [begin, end] : r.assistant_spans) {
    encode(at, begin, false);
    encode(begin, end, true);
    at = end;
  }
  encode(at, r.text.size(), false);
  return out;
}

void LayoutSftPack(const std::vector<const SftTokens*>& conversations, int32_t pad, int64_t seq_len,
                   int32_t* tokens, float* weights, int32_t* positions) {
  int64_t at = 0;
  for (const SftTokens* conversation : conversations) {
    const int64_t n = static_cast<int64_t>(conversation->ids.size());
    for (int64_t i = 0; i < n && at + i <= seq_len; ++i) {
      tokens[at + i] = conversation->ids[i];
      if (at + i < seq_len) {
        positions[at + i] = static_cast<int32_t>(i);
        weights[at + i] = i + 1 < n && conversation->trained[i + 1] ? 1.0f : 0.0f;
      }
    }
    at += n;
  }
  for (int64_t t = at; t <= seq_len; ++t) {
    tokens[t] = pad;
    if (t < seq_len) {
      positions[t] = static_cast<int32_t>(t - at);
      weights[t] = 0.0f;
    }
  }
}

void LayoutSftSample(const SftTokens& conversation, int32_t pad, int64_t seq_len, int32_t* tokens,
                     float* weights) {
  std::vector<int32_t> positions(static_cast<size_t>(seq_len));
  LayoutSftPack({&conversation}, pad, seq_len, tokens, weights, positions.data());
}

std::vector<SftConversation> ReadSftConversations(const std::string& path) {
  if (path.empty())
    throw UsageError("training.dataset_path: empty; name the conversations .jsonl file to read");
  if (!FileExists(path))
    throw UsageError(path + ": conversations file not found (training.dataset_path)");
  const std::string text = ReadFile(path);
  std::vector<SftConversation> out;
  size_t start = 0;
  for (int64_t line_no = 1; start < text.size(); ++line_no) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = Trim(std::string_view(text).substr(start, end - start));
    start = end + 1;
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw DataError(where +
                      ": not valid JSON (each line is one {\"messages\": [...]} or "
                      "{\"prompt\": ..., \"completion\": ...} object)");
    }
    if (!value.is_object())
      throw DataError(where +
                      ": not a JSON object (expected {\"messages\": [...]} or "
                      "{\"prompt\": ..., \"completion\": ...})");
    SftConversation c;
    c.where = where;
    if (value.contains("messages")) {
      c.messages = ChatMessagesFromJson(value["messages"], where);
    } else if (value.contains("prompt") || value.contains("completion")) {
      auto prompt = value.find("prompt"), completion = value.find("completion");
      if (prompt == value.end() || !prompt->is_string() || completion == value.end() ||
          !completion->is_string())
        throw DataError(where + ": \"prompt\" and \"completion\" must both be strings");
      c.messages = {{"user", prompt->get<std::string>()},
                    {"assistant", completion->get<std::string>()}};
    } else {
      throw DataError(where + ": has neither \"messages\" nor \"prompt\"/\"completion\"");
    }
    bool assistant = false;
    for (size_t i = 0; i < c.messages.size(); ++i) {
      const std::string& role = c.messages[i].role;
      if (role != "system" && role != "user" && role != "assistant")
        throw DataError(
            StrFormat("%s: message %zu: unknown role '%s' (expected system, user or "
                      "assistant)",
                      where.c_str(), i, role.c_str()));
      assistant = assistant || role == "assistant";
    }
    if (!assistant)
      throw DataError(where +
                      ": the conversation has no assistant message, so nothing in it "
                      "would be trained: add the reply or remove the line");
    out.push_back(std::move(c));
  }
  if (out.empty())
    throw DataError(path +
                    ": no conversations (the file is empty or blank; training.dataset_path)");
  return out;
}

namespace {

class SftSource : public TokenSource {
 public:
  SftSource(const SftOptions& o)
      : seq_len_(o.seq_len), path_(o.path), name_(o.chat_template), packing_(o.packing) {
    if (o.overlong != "truncate" && o.overlong != "skip")
      throw UsageError("sft.overlong: expected truncate or skip, got '" + o.overlong + "'");
    if (o.chat_template.empty())
      throw UsageError(
          "training.dataset = \"sft\" needs sft.chat_template: the template the "
          "conversations are rendered with (one of " +
          ChatTemplateNameList() + ")");
    CheckChatTemplateName(o.chat_template);
    if (o.tokenizer_path.empty())
      throw UsageError(
          "training.dataset = \"sft\" needs model.tokenizer_path: the tokenizer "
          "(holding the chat template's markers) that encodes the conversations");
    const Tokenizer tokenizer = Tokenizer::Load(o.tokenizer_path);
    RequireChatMarkers(tokenizer, o.chat_template, "the tokenizer " + o.tokenizer_path);
    pad_ = static_cast<int32_t>(tokenizer.TokenToId(ChatTemplateEndOfTurn(o.chat_template)));
    ChatTokens chat;
    if (tokenizer.bos_id() >= 0)
      chat.bos_token = tokenizer.IdToToken(static_cast<uint32_t>(tokenizer.bos_id()));
    if (tokenizer.eos_id() >= 0)
      chat.eos_token = tokenizer.IdToToken(static_cast<uint32_t>(tokenizer.eos_id()));

    const std::vector<SftConversation> read = ReadSftConversations(o.path);
    for (const SftConversation& c : read) {
      SftTokens t = TokenizeConversation(tokenizer, o.chat_template, c.messages, chat, c.where);
      for (int32_t id : t.ids)
        if (id < 0 || id >= o.vocab_size)
          throw DataError(
              StrFormat("%s: token %d is outside the model's vocabulary [0, %lld) "
                        "(check model.vocab_size against the tokenizer)",
                        c.where.c_str(), id, (long long)o.vocab_size));
      const bool overlong = static_cast<int64_t>(t.ids.size()) > seq_len_ + 1;
      if (overlong) {
        if (o.overlong == "skip") {
          ++skipped_;
          continue;
        }
        t.ids.resize(seq_len_ + 1);
        t.trained.resize(seq_len_ + 1);
        // Target 0 predicts id 1: id 0 is never a target.
        if (std::find(t.trained.begin() + 1, t.trained.end(), 1) == t.trained.end()) {
          ++skipped_;  // nothing of the reply is left within seq_len + 1 tokens
          continue;
        }
        ++truncated_;
      }
      for (size_t i = 1; i < t.trained.size(); ++i) assistant_tokens_ += t.trained[i];
      conversations_.push_back(std::move(t));
    }
    if (conversations_.empty())
      throw DataError(
          StrFormat("%s: all %zu conversations are longer than seq_len + 1 = %lld "
                    "tokens and were skipped (sft.overlong = %s): raise "
                    "training.seq_len or shorten them",
                    o.path.c_str(), read.size(), (long long)(seq_len_ + 1), o.overlong.c_str()));
    // One seeded shuffle, the same every epoch.
    std::vector<int64_t> order(conversations_.size());
    std::iota(order.begin(), order.end(), int64_t{0});
    Philox rng(o.seed ^ 0x5f7c0de5ULL, 0);
    for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i)
      std::swap(order[i], order[rng.NextBelow(static_cast<uint64_t>(i + 1))]);
    samples_ = packing_ ? PackConversations(order) : OnePerSample(order);
    int64_t padding = 0;
    for (size_t i = 0; i < samples_.size(); ++i) padding += SamplePadding(static_cast<int64_t>(i));
    padding_share_ = static_cast<double>(padding) /
                     static_cast<double>(static_cast<int64_t>(samples_.size()) * seq_len_);
    if (o.report) {
      PrintLine(
          StrFormat("phase=sft conversations=%zu truncated=%lld skipped=%lld assistant_tokens=%lld "
                    "template=%s overlong=%s packing=%s samples=%zu padding=%.4f path=%s",
                    conversations_.size(), (long long)truncated_, (long long)skipped_,
                    (long long)assistant_tokens_, name_.c_str(), o.overlong.c_str(),
                    packing_ ? "on" : "off", samples_.size(), padding_share_, o.path.c_str()));
      if (truncated_ + skipped_ > 0)
        LogWarn(
            StrFormat("%s: %lld conversations are longer than seq_len + 1 = %lld tokens: "
                      "%lld truncated, %lld skipped (sft.overlong = %s)",
                      o.path.c_str(), (long long)(truncated_ + skipped_), (long long)(seq_len_ + 1),
                      (long long)truncated_, (long long)skipped_, o.overlong.c_str()));
    }
  }

  void Sample(int64_t index, int32_t* tokens) const override {
    std::vector<float> weights(seq_len_);
    std::vector<int32_t> positions(seq_len_);
    Layout(index, tokens, weights.data(), positions.data());
  }
  bool weighted() const override { return true; }
  void SampleWeights(int64_t index, float* weights) const override {
    std::vector<int32_t> tokens(seq_len_ + 1), positions(seq_len_);
    Layout(index, tokens.data(), weights, positions.data());
  }
  bool packed() const override { return packing_; }
  void SamplePositions(int64_t index, int32_t* positions) const override {
    std::vector<int32_t> tokens(seq_len_ + 1);
    std::vector<float> weights(seq_len_);
    Layout(index, tokens.data(), weights.data(), positions);
  }
  bool pads() const override { return true; }
  // One layout for all three (a batch read would otherwise lay each sample out three times).
  void SampleAll(int64_t index, int32_t* tokens, float* weights,
                 int32_t* positions) const override {
    std::vector<int32_t> unused_positions;
    if (!positions) {
      unused_positions.resize(seq_len_);
      positions = unused_positions.data();
    }
    Layout(index, tokens, weights, positions);
  }
  int64_t SamplePadding(int64_t index) const override {
    int64_t content = 0;
    for (int64_t c : At(index)) content += static_cast<int64_t>(conversations_[c].ids.size());
    return seq_len_ - std::min(content, seq_len_);
  }
  std::string Describe() const override {
    return StrFormat("sft(%s, %zu conversations in %zu samples, template %s, packing %s)",
                     path_.c_str(), conversations_.size(), samples_.size(), name_.c_str(),
                     packing_ ? "on" : "off");
  }

 private:
  // The conversations of sample `index` (the samples repeat, the same every epoch).
  const std::vector<int64_t>& At(int64_t index) const {
    return samples_[index % static_cast<int64_t>(samples_.size())];
  }
  std::vector<std::vector<int64_t>> OnePerSample(const std::vector<int64_t>& order) const {
    std::vector<std::vector<int64_t>> samples;
    for (int64_t c : order) samples.push_back({c});
    return samples;
  }
  // First fit over the shuffled order: each conversation goes into the first of the open samples
  // (in the order they were opened) with room for all its tokens (seq_len + 1 a sample), else
  // opens a new one; of more than kOpen open samples the oldest is closed. A pure function of
  // the order and the lengths.
  std::vector<std::vector<int64_t>> PackConversations(const std::vector<int64_t>& order) const {
    constexpr size_t kOpen = 64;
    std::vector<std::vector<int64_t>> samples;
    std::vector<int64_t> room;  // per sample, tokens left
    std::vector<size_t> open;   // samples still taking conversations, oldest first
    for (int64_t c : order) {
      const int64_t n = static_cast<int64_t>(conversations_[c].ids.size());
      auto fit = std::find_if(open.begin(), open.end(), [&](size_t s) { return room[s] >= n; });
      if (fit == open.end()) {
        if (open.size() == kOpen) open.erase(open.begin());
        samples.emplace_back();
        room.push_back(seq_len_ + 1);
        open.push_back(samples.size() - 1);
        fit = open.end() - 1;
      }
      samples[*fit].push_back(c);
      room[*fit] -= n;
    }
    return samples;
  }
  void Layout(int64_t index, int32_t* tokens, float* weights, int32_t* positions) const {
    std::vector<const SftTokens*> pack;
    for (int64_t c : At(index)) pack.push_back(&conversations_[c]);
    LayoutSftPack(pack, pad_, seq_len_, tokens, weights, positions);
  }

  int64_t seq_len_;
  std::string path_, name_;
  bool packing_;
  int32_t pad_ = 0;
  std::vector<SftTokens> conversations_;
  std::vector<std::vector<int64_t>> samples_;
  double padding_share_ = 0;
  int64_t truncated_ = 0, skipped_ = 0, assistant_tokens_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> MakeSftSource(const SftOptions& options) {
  return std::make_unique<SftSource>(options);
}

std::string ResolveSftChatTemplate(const Config& config, std::string* source) {
  const std::string named = config.String("sft.chat_template");
  if (!named.empty()) {
    CheckChatTemplateName(named);
    return named;
  }
  std::vector<std::string> looked;
  const std::string hf = config.String("checkpoint.initial_load_hf");
  if (!hf.empty()) looked.push_back(JoinPath(hf, "tokenizer_config.json"));
  if (const std::string tokenizer = config.String("model.tokenizer_path"); !tokenizer.empty()) {
    const std::string parent = ParentDirectory(tokenizer);
    looked.push_back(JoinPath(parent.empty() ? "." : parent, "tokenizer_config.json"));
  }
  for (const std::string& path : looked) {
    if (!FileExists(path)) continue;
    const TokenizerChatConfig chat = ReadTokenizerChatConfig(path);
    if (!chat.has_chat_template) continue;
    const ChatTemplateMatch match =
        MatchChatTemplate(chat.chat_template, chat.special_tokens, path);
    if (match.name.empty())
      throw UsageError("sft.chat_template is not set and " + match.refusal +
                       " (set sft.chat_template to train with one of them)");
    if (source) *source = path;
    return match.name;
  }
  std::string where;
  for (const std::string& path : looked) where += (where.empty() ? "" : ", ") + path;
  throw UsageError(
      "training.dataset = \"sft\" needs sft.chat_template: the template the conversations are "
      "rendered with (one of " +
      ChatTemplateNameList() + "), or a tokenizer_config.json that carries one (looked in: " +
      (where.empty() ? std::string("none: no checkpoint.initial_load_hf or model.tokenizer_path")
                     : where) +
      ")");
}

std::unique_ptr<TokenSource> MakeSftSource(const Config& config, int64_t vocab_size,
                                           int64_t seq_len) {
  SftOptions o;
  o.path = config.String("training.dataset_path");
  o.chat_template = ResolveSftChatTemplate(config);
  o.overlong = config.String("sft.overlong");
  o.packing = config.Bool("sft.packing");
  o.tokenizer_path = config.String("model.tokenizer_path");
  o.seq_len = seq_len;
  o.vocab_size = vocab_size;
  o.seed = static_cast<uint64_t>(config.Int("debug.seed"));
  o.report = RankIdentityFromEnvironment(CurrentEnvironment(), "").rank == 0;
  return MakeSftSource(o);
}

}  // namespace crucible
