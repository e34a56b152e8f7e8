// Helpers for the tokenizer tests: a tokenizer.json built from a list of merges.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace crucible::testing {

struct TestTokenizerSpec {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, rank order
  nlohmann::json pre_tokenizer = {{"type", "ByteLevel"},
                                  {"add_prefix_space", false},
                                  {"trim_offsets", true},
                                  {"use_regex", true}};
  nlohmann::json added_tokens = nlohmann::json::array();
  bool ignore_merges = false;
  bool array_merges = false;
};

// Vocab: the 256 bytes (id = byte value), then each merge result in order (if new).
inline nlohmann::ordered_json MakeTokenizerJson(const TestTokenizerSpec& spec) {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b)
    vocab[BytesToByteLevel(std::string(1, static_cast<char>(b)))] = next++;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [a, b] : spec.merges) {
    std::string left = BytesToByteLevel(a), right = BytesToByteLevel(b);
    if (!vocab.contains(left + right)) vocab[left + right] = next++;
    if (spec.array_merges)
      merges.push_back({left, right});
    else
      merges.push_back(left + " " + right);
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (auto token : spec.added_tokens) {
    if (!token.contains("id")) token["id"] = next++;
    added.push_back(nlohmann::ordered_json::parse(token.dump()));
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", nlohmann::ordered_json::parse(spec.pre_tokenizer.dump())},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"ignore_merges", spec.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

inline Tokenizer MakeTokenizer(const TestTokenizerSpec& spec) {
  return Tokenizer::FromJson(MakeTokenizerJson(spec).dump(), "test.json");
}

inline nlohmann::json Special(const std::string& content, bool lstrip = false, bool rstrip = false,
                              bool normalized = false) {
  return {{"content", content}, {"single_word", false},     {"lstrip", lstrip},
          {"rstrip", rstrip},   {"normalized", normalized}, {"special", true}};
}

}  // namespace crucible::testing
