// The named chat templates (sft/chat_template.h): their renderings and assistant spans, the
// errors for an unknown role or template name, tokenizer_config.json reading, and detection by
// rendering: each reference template under tests/golden/chat_templates/ is recognised, a changed
// one or one using an unsupported construct is refused in one line. (That the renderings equal
// transformers' is tests/integration/test_chat_template.py.)
#include "sft/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/error.h"

namespace crucible {
namespace {

std::string ReadGolden(const std::string& name) {
  std::ifstream in(std::string(CRUCIBLE_SOURCE_DIR) + "/tests/golden/chat_templates/" + name,
                   std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

const std::vector<ChatMessage> kConversation = {{"system", "Be brief."},
                                                {"user", " Hi "},
                                                {"assistant", " Hello!\n"},
                                                {"user", "Bye"},
                                                {"assistant", "Bye."}};

std::vector<std::string> Spans(const ChatRendering& r) {
  std::vector<std::string> out;
  for (auto [begin, end] : r.assistant_spans) out.push_back(r.text.substr(begin, end - begin));
  return out;
}

TEST(ChatTemplateTest, Llama3StripsContentAndTrainsOnItAndEotId) {
  ChatRendering r =
      RenderChat("llama3", kConversation, false, {"<|begin_of_text|>", "<|end_of_text|>"});
  EXPECT_EQ(r.text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nBye.<|eot_id|>");
  EXPECT_EQ(Spans(r), (std::vector<std::string>{"Hello!<|eot_id|>", "Bye.<|eot_id|>"}));
  ChatRendering prompt = RenderChat("llama3", {{"user", "Q"}}, true, {"<|begin_of_text|>", ""});
  EXPECT_EQ(prompt.text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_TRUE(prompt.assistant_spans.empty());
}

TEST(ChatTemplateTest, ChatmlKeepsContentAndTrainsOnItAndImEnd) {
  ChatRendering r = RenderChat("chatml", kConversation, true, {"<s>", "</s>"});
  EXPECT_EQ(r.text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
            "<|im_start|>assistant\n Hello!\n<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\nBye.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Spans(r), (std::vector<std::string>{" Hello!\n<|im_end|>", "Bye.<|im_end|>"}));
}

TEST(ChatTemplateTest, DeepseekV3HoistsSystemMessagesAndTrainsOnEndOfSentence) {
  std::vector<ChatMessage> messages = kConversation;
  messages.push_back({"system", "Second."});
  ChatRendering r = RenderChat("deepseek-v3", messages, true, {"<｜begin▁of▁sentence｜>", ""});
  EXPECT_EQ(r.text,
            "<｜begin▁of▁sentence｜>Be brief.\n\nSecond.<｜User｜> Hi <｜Assistant｜> "
            "Hello!\n<｜end▁of▁sentence｜>"
            "<｜User｜>Bye<｜Assistant｜>Bye.<｜end▁of▁sentence｜><｜Assistant｜>");
  EXPECT_EQ(Spans(r), (std::vector<std::string>{" Hello!\n<｜end▁of▁sentence｜>",
                                                "Bye.<｜end▁of▁sentence｜>"}));
}

TEST(ChatTemplateTest, AnUnknownRoleIsOneLineNamingItAndItsIndex) {
  try {
    RenderChat("chatml", {{"user", "a"}, {"tool", "b"}}, false, {}, "data.jsonl:7");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_STREQ(
        e.what(),
        "data.jsonl:7: message 1: unknown role 'tool' (expected system, user or assistant)");
  }
  try {
    RenderChat("llama2", {{"user", "a"}}, false, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_STREQ(e.what(),
                 "unknown chat template 'llama2' (expected one of llama3, chatml, deepseek-v3)");
  }
  EXPECT_THROW(ChatMessagesFromJson(nlohmann::json::parse(R"([{"role": "user"}])"), "x"), Error);
  EXPECT_THROW(
      ChatMessagesFromJson(nlohmann::json::parse(R"([{"role": "user", "content": null}])"), "x"),
      Error);
}

nlohmann::ordered_json Tokens(const std::string& bos) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  tokens["bos_token"] = bos;
  tokens["eos_token"] = "</s>";
  return tokens;
}

TEST(ChatTemplateTest, EachReferenceTemplateIsDetectedAsItsName) {
  EXPECT_EQ(MatchChatTemplate(ReadGolden("llama3.jinja"), Tokens("<|begin_of_text|>"), "t").name,
            "llama3");
  EXPECT_EQ(MatchChatTemplate(ReadGolden("chatml.jinja"), Tokens("<s>"), "t").name, "chatml");
  EXPECT_EQ(
      MatchChatTemplate(ReadGolden("deepseek-v3.jinja"), Tokens("<｜begin▁of▁sentence｜>"), "t")
          .name,
      "deepseek-v3");
  // By rendering, not text: the same template written differently is still llama3.
  std::string respelled =
      "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
      "{{- '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' ~ (m.content|trim) ~ "
      "'<|eot_id|>' -}}"
      "{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
  EXPECT_EQ(MatchChatTemplate(respelled, Tokens("<|begin_of_text|>"), "t").name, "llama3");
}

TEST(ChatTemplateTest, AChangedTemplateIsRefusedInOneLineNamingTheProbe) {
  std::string llama3 = ReadGolden("llama3.jinja");
  std::string changed = llama3;
  changed.replace(changed.find("'<|eot_id|>'"), 12,
                  "'<|eot_id|>\\n'");  // an extra newline per turn
  ChatTemplateMatch match =
      MatchChatTemplate(changed, Tokens("<|begin_of_text|>"), "tokenizer_config.json");
  EXPECT_EQ(match.name, "");
  EXPECT_EQ(match.refusal.find('\n'), std::string::npos) << match.refusal;
  EXPECT_EQ(match.refusal.rfind(
                "tokenizer_config.json: chat_template is not one of llama3, chatml, deepseek-v3 "
                "(the closest, llama3, differs on probe 1 of ",
                0),
            0u)
      << match.refusal;
  EXPECT_NE(match.refusal.find("at byte 74: the template writes \"\\n<|start_header_id"),
            std::string::npos)
      << match.refusal;
  EXPECT_NE(match.refusal.find("; pass --chat-template NAME"), std::string::npos) << match.refusal;
  // Qwen2.5's ChatML adds a default system message: not plain chatml.
  std::string qwen =
      "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are "
      "Qwen.<|im_end|>\\n' }}{%- endif %}" +
      ReadGolden("chatml.jinja");
  match = MatchChatTemplate(qwen, Tokens(""), "cfg");
  EXPECT_NE(match.refusal.find("(the closest, chatml, differs on probe 1 of"), std::string::npos)
      << match.refusal;
  // A template that raises on a probe is refused naming the message.
  match = MatchChatTemplate(
      "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}" +
          ReadGolden("chatml.jinja"),
      Tokens(""), "cfg");
  EXPECT_NE(match.refusal.find("the template raised 'no system'"), std::string::npos)
      << match.refusal;
}

TEST(ChatTemplateTest, UnsupportedConstructsAndBadJinjaAreRefusedCleanly) {
  ChatTemplateMatch match = MatchChatTemplate(
      "{{ bos_token }}{{ 'Today: ' + strftime_now('%d %b %Y') }}" + ReadGolden("chatml.jinja"),
      Tokens("<s>"), "cfg");
  EXPECT_EQ(match.name, "");
  EXPECT_NE(match.refusal.find(
                "uses a construct crucible's Jinja does not support (function 'strftime_now()'"),
            std::string::npos)
      << match.refusal;
  match = MatchChatTemplate("{% call foo() %}{% endcall %}", Tokens("<s>"), "cfg");
  EXPECT_NE(match.refusal.find("statement '{% call %}'"), std::string::npos) << match.refusal;
  match = MatchChatTemplate("{% for m in messages %}", Tokens("<s>"), "cfg");
  EXPECT_NE(match.refusal.find(
                "is not valid Jinja (line 1: unexpected end of template, expected 'endfor')"),
            std::string::npos)
      << match.refusal;
  for (const auto& r : {match.refusal}) EXPECT_EQ(r.find('\n'), std::string::npos);
}

TEST(ChatTemplateTest, ReadsTheTemplateAndTokensOfATokenizerConfig) {
  std::string path =
      WriteFile("tokenizer_config_a.json",
                R"({"bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>",
                                   "pad_token": null, "chat_template": "{{ bos_token }}x"})");
  TokenizerChatConfig config = ReadTokenizerChatConfig(path);
  EXPECT_TRUE(config.has_chat_template);
  EXPECT_EQ(config.chat_template, "{{ bos_token }}x");
  EXPECT_EQ(config.special_tokens.dump(), R"({"bos_token":"<B>","eos_token":"<E>"})");
  path = WriteFile(
      "tokenizer_config_b.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(ReadTokenizerChatConfig(path).chat_template, "D");
  path = WriteFile("tokenizer_config_c.json",
                   R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_THROW(ReadTokenizerChatConfig(path), Error);
  path = WriteFile("tokenizer_config_d.json", R"({"chat_template": 5})");
  EXPECT_THROW(ReadTokenizerChatConfig(path), Error);
}

}  // namespace
}  // namespace crucible
