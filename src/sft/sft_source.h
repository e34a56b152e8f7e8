// The supervised fine-tuning data source ([training] dataset = "sft"). Each conversation of a
// jsonl file ({"messages": [{"role", "content"}...]} or {"prompt", "completion"}, the latter one
// user and one assistant message) is rendered by a named chat template (sft/chat_template.h) and
// tokenized; a target is trained (loss weight 1) when the token it predicts lies in an assistant
// span of the same conversation, else it weighs 0, as do the padding targets.
//
// Rules (docs/post-training.md "Supervised fine-tuning"):
// - Tokens never straddle a span boundary: the rendered text is cut at every assistant span's
//   ends and each piece is encoded on its own, as generation sees it (the prompt up to the
//   generation prompt is encoded whole, the reply is new tokens). For the named templates every
//   cut falls at a special marker or after a newline, where the pre-tokenizer cuts anyway.
// - `order` is one Fisher-Yates shuffle of the N kept conversations seeded by [debug] seed.
//   Without packing sample i is conversation order[i mod N]; with [sft] packing the
//   conversations are packed in that order into samples of seq_len + 1 tokens by first fit (see
//   PackConversations) and sample i is pack i mod P. The same every epoch; a pure function of i.
// - Packed, each input token carries its position in its conversation (TokenSource::packed):
//   attention stays inside a conversation and RoPE counts from its start, so a conversation's
//   loss and gradient are those it has alone in a sample (to float tolerance: the products over
//   the other rows differ only in what they sum).
// - A conversation of more than seq_len + 1 tokens is cut to its first seq_len + 1 ("truncate",
//   kept only if a trained target remains) or dropped ("skip"); both are counted and reported.
// - Padding (after the last conversation, to seq_len + 1 tokens) is the template's end-of-turn
//   id; the phase=sft line reports the share of padded inputs over all samples.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "data/token_source.h"
#include "sft/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace crucible {

// A conversation as tokens: ids, and per id whether it is an assistant token (trained).
struct SftTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
};

// Renders `messages` with template `name` (no generation prompt) and encodes it piecewise at the
// assistant spans' ends (above).
SftTokens TokenizeConversation(const Tokenizer& tokenizer, const std::string& name,
                               const std::vector<ChatMessage>& messages, const ChatTokens& tokens,
                               const std::string& where);

// Lays conversations (of seq_len + 1 tokens together at most; a longer tail is cut) out as one
// sample, one after another: tokens (seq_len + 1, then `pad` to the end), weights (seq_len: 1
// where target t, i.e. token t + 1, is a trained token of the same conversation as token t, else
// 0: across a boundary and on padding) and positions (seq_len: each input's position in its
// conversation; the padding counts from 0 as a document of its own, so it attends none of them).
void LayoutSftPack(const std::vector<const SftTokens*>& conversations, int32_t pad, int64_t seq_len,
                   int32_t* tokens, float* weights, int32_t* positions);
// One conversation alone (its positions are 0..).
void LayoutSftSample(const SftTokens& conversation, int32_t pad, int64_t seq_len, int32_t* tokens,
                     float* weights);

// One conversation of a jsonl file, before rendering: "<file>:<line>" and its messages.
struct SftConversation {
  std::string where;
  std::vector<ChatMessage> messages;
};
// Reads every non-blank line. DataError (exit 65) naming file:line for a malformed line (not JSON,
// not an object, neither "messages" nor "prompt"/"completion" strings), a conversation with no
// assistant message, or an unknown role; for a file with no conversation. UsageError when the
// file does not exist.
std::vector<SftConversation> ReadSftConversations(const std::string& path);

struct SftOptions {
  std::string path, chat_template, overlong = "truncate", tokenizer_path;
  bool packing = false;  // several conversations a sample (below)
  int64_t seq_len = 0, vocab_size = 0;
  uint64_t seed = 0;
  bool report = true;  // print the phase=sft line
};
std::unique_ptr<TokenSource> MakeSftSource(const SftOptions& options);
// [sft] chat_template as a run uses it: the configured name; when empty, the named template that
// a tokenizer_config.json carries, detected by its rendering (sft/chat_template.h
// MatchChatTemplate): checkpoint.initial_load_hf's, else the one beside model.tokenizer_path.
// UsageError in one line when there is none (naming where it looked) or it is not one of the
// named templates (the detection's refusal). `source` says where a detected one came from.
std::string ResolveSftChatTemplate(const Config& config, std::string* source = nullptr);

// From [training] dataset_path, [sft] chat_template / overlong, [model] tokenizer_path and
// [debug] seed; UsageError naming the key when one is missing or unknown. The phase=sft line is
// printed on rank 0 only.
std::unique_ptr<TokenSource> MakeSftSource(const Config& config, int64_t vocab_size,
                                           int64_t seq_len);

}  // namespace crucible
