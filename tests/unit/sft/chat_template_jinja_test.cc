// Crucible's own Jinja for the named templates (sft/chat_template_jinja.h): each detects as the
// template it stands for, with and without bos/eos tokens, and is not the vendors' text; the
// markers and end-of-turn markers; the marker check against a tokenizer. (That transformers renders
// the exported Jinja as RenderChat does is tests/integration/test_generate_chat.py.)
#include "sft/chat_template_jinja.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"
#include "sft/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

TEST(ChatTemplateJinja, EachDetectsAsItsTemplate) {
  for (const std::string& name : ChatTemplateNames()) {
    for (const auto& special : {nlohmann::ordered_json::object(),
                                nlohmann::ordered_json{{"bos_token", "<|begin_of_text|>"},
                                                       {"eos_token", "<|end_of_text|>"}},
                                nlohmann::ordered_json{{"bos_token", "<s>"}}}) {
      const ChatTemplateMatch match = MatchChatTemplate(ChatTemplateJinja(name), special, name);
      EXPECT_EQ(match.name, name) << match.refusal;
    }
  }
}

TEST(ChatTemplateJinja, IsNotTheReferenceText) {
  const std::map<std::string, std::string> golden = {
      {"llama3", "llama3.jinja"}, {"chatml", "chatml.jinja"}, {"deepseek-v3", "deepseek-v3.jinja"}};
  for (const auto& [name, file] : golden) {
    std::ifstream in(std::string(CRUCIBLE_SOURCE_DIR) + "/tests/golden/chat_templates/" + file,
                     std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    EXPECT_NE(buffer.str(), ChatTemplateJinja(name)) << name;
    EXPECT_EQ(ChatTemplateJinja(name).find('\n'), std::string::npos) << name;
  }
}

TEST(ChatTemplateJinja, MarkersAndEndOfTurn) {
  EXPECT_EQ(ChatTemplateEndOfTurn("chatml"), "<|im_end|>");
  EXPECT_EQ(ChatTemplateEndOfTurn("llama3"), "<|eot_id|>");
  EXPECT_EQ(ChatTemplateEndOfTurn("deepseek-v3"), "<｜end▁of▁sentence｜>");
  for (const std::string& name : ChatTemplateNames()) {
    const auto& markers = ChatTemplateMarkers(name);
    EXPECT_NE(std::find(markers.begin(), markers.end(), ChatTemplateEndOfTurn(name)),
              markers.end());
    // Every marker appears in a rendering of a full conversation.
    const std::string text =
        RenderChat(name, {{"system", "s"}, {"user", "u"}, {"assistant", "a"}}, true, ChatTokens{})
            .text;
    for (const std::string& marker : markers)
      EXPECT_NE(text.find(marker), std::string::npos) << name << " " << marker;
  }
  EXPECT_THROW(ChatTemplateMarkers("zephyr"), Error);
}

TEST(ChatTemplateJinja, RequireChatMarkersNamesTheMissingOne) {
  TokenizerTrainOptions options;
  options.vocab_size = 300;
  options.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  TokenizerTrainer trainer(options);
  trainer.AddDocuments({"hello world, the quick brown fox jumps over the lazy dog"});
  const Tokenizer tokenizer = trainer.Train();
  EXPECT_NO_THROW(RequireChatMarkers(tokenizer, "chatml", "t"));
  try {
    RequireChatMarkers(tokenizer, "llama3", "the tokenizer t");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    const std::string message = e.what();
    EXPECT_NE(message.find("writes <|start_header_id|> as one special token, but the tokenizer t "
                           "has no such token"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("--special '<|start_header_id|>'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
