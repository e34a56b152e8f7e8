// The named chat templates, written out in C++ from their reference Jinja (chat_template.h), and
// their detection by rendering.
#include "sft/chat_template.h"

#include <algorithm>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "sft/jinja.h"

namespace crucible {
namespace {

enum class Role { kSystem, kUser, kAssistant };

Role ParseRole(const ChatMessage& message, size_t index, const std::string& where) {
  if (message.role == "system") return Role::kSystem;
  if (message.role == "user") return Role::kUser;
  if (message.role == "assistant") return Role::kAssistant;
  throw DataError(where + ": message " + std::to_string(index) + ": unknown role '" + message.role +
                  "' (expected system, user or assistant)");
}

// Appends `text`, and records it as an assistant span when `assistant` is set.
struct Writer {
  ChatRendering out;
  void Add(const std::string& text) { out.text += text; }
  void AddAssistant(const std::string& content, const char* end_of_turn) {
    size_t begin = out.text.size();
    out.text += content;
    out.text += end_of_turn;
    out.assistant_spans.emplace_back(begin, out.text.size());
  }
};

// {% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] +
// '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}
// {% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}
// {% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif
// %}
ChatRendering RenderLlama3(const std::vector<ChatMessage>& messages, const std::vector<Role>& roles,
                           bool add_generation_prompt, const ChatTokens& tokens) {
  Writer w;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) w.Add(tokens.bos_token);
    w.Add("<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n");
    std::string content = jinja::PythonStrip(messages[i].content, nullptr, true, true);
    if (roles[i] == Role::kAssistant)
      w.AddAssistant(content, "<|eot_id|>");
    else
      w.Add(content + "<|eot_id|>");
  }
  if (add_generation_prompt) w.Add("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return std::move(w.out);
}

// {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] +
// '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%
// endif %}
ChatRendering RenderChatml(const std::vector<ChatMessage>& messages, const std::vector<Role>& roles,
                           bool add_generation_prompt) {
  Writer w;
  for (size_t i = 0; i < messages.size(); ++i) {
    w.Add("<|im_start|>" + messages[i].role + "\n");
    if (roles[i] == Role::kAssistant)
      w.AddAssistant(messages[i].content, "<|im_end|>");
    else
      w.Add(messages[i].content + "<|im_end|>");
    w.Add("\n");
  }
  if (add_generation_prompt) w.Add("<|im_start|>assistant\n");
  return std::move(w.out);
}

// bos_token + the system messages joined by '\n\n'; then '<｜User｜>' + content per user message
// and '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' per assistant message (the tool-call
// branches of the template need roles and fields conversations here do not have); '<｜Assistant｜>'
// as the generation prompt.
ChatRendering RenderDeepseekV3(const std::vector<ChatMessage>& messages,
                               const std::vector<Role>& roles, bool add_generation_prompt,
                               const ChatTokens& tokens) {
  Writer w;
  w.Add(tokens.bos_token);
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (roles[i] != Role::kSystem) continue;
    if (!first_system) w.Add("\n\n");
    w.Add(messages[i].content);
    first_system = false;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (roles[i] == Role::kUser) {
      w.Add("<｜User｜>" + messages[i].content);
    } else if (roles[i] == Role::kAssistant) {
      w.Add("<｜Assistant｜>");
      w.AddAssistant(messages[i].content, "<｜end▁of▁sentence｜>");
    }
  }
  if (add_generation_prompt) w.Add("<｜Assistant｜>");
  return std::move(w.out);
}

std::string TokenString(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();  // {"__type": "AddedToken", "content": ...}
  return "";
}

// A short, escaped excerpt of `text` from byte `at` (from the start of the character it falls
// in), whole characters only, for messages.
std::string Excerpt(const std::string& text, size_t at) {
  if (at >= text.size()) return "the end";
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) --at;
  size_t end = at;
  while (end < text.size() && end - at < 24) {
    unsigned char lead = static_cast<unsigned char>(text[end]);
    size_t length = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
    if (end + length > text.size() || end + length - at > 24) break;
    end += length;
  }
  return nlohmann::json(text.substr(at, end - at))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

const std::vector<std::string>& ChatTemplateNames() {
  static const std::vector<std::string> names = {"llama3", "chatml", "deepseek-v3"};
  return names;
}

std::string ChatTemplateNameList() {
  std::string out;
  for (const auto& name : ChatTemplateNames()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

void CheckChatTemplateName(const std::string& name) {
  const auto& names = ChatTemplateNames();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw UsageError("unknown chat template '" + name + "' (expected one of " +
                     ChatTemplateNameList() + ")");
}

ChatRendering RenderChat(const std::string& name, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt, const ChatTokens& tokens,
                         const std::string& where) {
  CheckChatTemplateName(name);
  std::vector<Role> roles;
  for (size_t i = 0; i < messages.size(); ++i) roles.push_back(ParseRole(messages[i], i, where));
  if (name == "llama3") return RenderLlama3(messages, roles, add_generation_prompt, tokens);
  if (name == "chatml") return RenderChatml(messages, roles, add_generation_prompt);
  return RenderDeepseekV3(messages, roles, add_generation_prompt, tokens);
}

std::vector<ChatMessage> ChatMessagesFromJson(const nlohmann::json& messages,
                                              const std::string& where) {
  if (!messages.is_array()) throw DataError(where + ": \"messages\" is not a list");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string at = where + ": message " + std::to_string(i);
    if (!m.is_object()) throw DataError(at + " is not an object");
    auto role = m.find("role"), content = m.find("content");
    if (role == m.end() || !role->is_string()) throw DataError(at + " has no string \"role\"");
    if (content == m.end() || !content->is_string())
      throw DataError(at + " has no string \"content\"");
    out.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return out;
}

TokenizerChatConfig ReadTokenizerChatConfig(const std::string& path) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(ReadConfigFile(path));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!config.is_object()) throw UsageError(path + ": not a JSON object");
  TokenizerChatConfig out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    auto it = config.find(key);
    if (it != config.end() && !TokenString(*it).empty()) out.special_tokens[key] = TokenString(*it);
  }
  if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& token : *it) list.push_back(TokenString(token));
    out.special_tokens["additional_special_tokens"] = list;
  }
  auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) {
    out.chat_template = it->get<std::string>();
    out.has_chat_template = true;
  } else if (it != config.end() && it->is_array()) {  // [{"name": "default", "template": ...}, ...]
    for (const auto& entry : *it)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        out.chat_template = entry["template"].get<std::string>();
        out.has_chat_template = true;
      }
    if (!out.has_chat_template)
      throw UsageError(path + ": chat_template is a list without a \"default\" template");
  } else if (it != config.end() && !it->is_null()) {
    throw UsageError(path + ": chat_template is neither a string nor a list of named templates");
  } else {
    const std::string parent = ParentDirectory(path);
    const std::string beside = JoinPath(parent.empty() ? "." : parent, "chat_template.jinja");
    if (FileExists(beside)) {
      out.chat_template = ReadConfigFile(beside);
      out.has_chat_template = true;
    }
  }
  return out;
}

const std::vector<ChatProbe>& ChatTemplateProbes() {
  using M = ChatMessage;
  static const std::vector<ChatProbe> probes = {
      {{M{"user", "Hello"}}, true},
      {{M{"user", "Hello"}}, false},
      {{M{"system", "You are a helpful assistant."}, M{"user", "Hi"},
        M{"assistant", "Hello! How can I help?"}},
       false},
      {{M{"user", "What is 2+2?"}, M{"assistant", "4"}, M{"user", "And 3+3?"}, M{"assistant", "6"}},
       false},
      {{M{"system", "Be brief."}, M{"user", "Hi"}, M{"assistant", "Hey"}, M{"user", "Bye"}}, true},
      {{M{"user", "  padded question \n"}, M{"assistant", "\n padded answer  "}}, false},
      {{M{"user", ""}, M{"assistant", ""}}, false},
      {{M{"user", "Grüße 👋 — 東京"}, M{"assistant", "\u3000こんにちは\u00a0"}}, false},
      {{M{"system", "first"}, M{"system", "second"}, M{"user", "q"}, M{"assistant", "a"}}, false},
      {{M{"user", "multi\nline\r\ntext {{ not a tag }}"}, M{"assistant", "a\tb <|eot_id|>"}}, true},
      {{M{"assistant", "I start."}, M{"user", "ok"}}, true},
  };
  return probes;
}

ChatTemplateMatch MatchChatTemplate(const std::string& jinja_text,
                                    const nlohmann::ordered_json& special_tokens,
                                    const std::string& source) {
  const std::string names = ChatTemplateNameList();
  const std::string suffix = "; pass --chat-template NAME (one of " + names + ")";
  ChatTemplateMatch result;
  jinja::Template jinja_template;
  try {
    jinja_template = jinja::Template::Parse(jinja_text);
  } catch (const jinja::Error& e) {
    std::string where = e.line() ? "line " + std::to_string(e.line()) + ": " : "";
    result.refusal =
        source + ": chat_template " +
        (e.kind() == jinja::Error::kUnsupported
             ? "uses a construct crucible's Jinja does not support (" + where + e.what() + ")"
             : "is not valid Jinja (" + where + e.what() + ")") +
        ", so it cannot be matched to " + names + suffix;
    return result;
  }
  ChatTokens tokens;
  if (special_tokens.contains("bos_token"))
    tokens.bos_token = special_tokens["bos_token"].get<std::string>();
  if (special_tokens.contains("eos_token"))
    tokens.eos_token = special_tokens["eos_token"].get<std::string>();

  // Each named template's count of matching probes and its first difference.
  struct Score {
    size_t matched = 0;
    std::string first_difference;
  };
  std::vector<Score> scores(ChatTemplateNames().size());
  const auto& probes = ChatTemplateProbes();
  for (size_t p = 0; p < probes.size(); ++p) {
    nlohmann::ordered_json variables = special_tokens;
    variables["messages"] = nlohmann::ordered_json::array();
    for (const auto& m : probes[p].messages)
      variables["messages"].push_back({{"role", m.role}, {"content", m.content}});
    variables["add_generation_prompt"] = probes[p].add_generation_prompt;
    std::string rendered, failure;
    try {
      rendered = jinja_template.Render(variables);
    } catch (const jinja::Error& e) {
      std::string where = e.line() ? " at line " + std::to_string(e.line()) : "";
      switch (e.kind()) {
        case jinja::Error::kRaised:
          failure = "the template raised '" + std::string(e.what()) + "'";
          break;
        case jinja::Error::kUnsupported:
          result.refusal = source +
                           ": chat_template uses a construct crucible's Jinja does not support (" +
                           e.what() + where + ", on probe " + std::to_string(p + 1) +
                           "), so it cannot be matched to " + names + suffix;
          return result;
        default:
          failure = "the template failed" + where + ": " + e.what();
      }
    }
    const std::string label =
        "probe " + std::to_string(p + 1) + " of " + std::to_string(probes.size());
    for (size_t t = 0; t < scores.size(); ++t) {
      std::string expected = RenderChat(ChatTemplateNames()[t], probes[p].messages,
                                        probes[p].add_generation_prompt, tokens)
                                 .text;
      if (failure.empty() && rendered == expected) {
        ++scores[t].matched;
        continue;
      }
      if (!scores[t].first_difference.empty()) continue;
      if (!failure.empty()) {
        scores[t].first_difference = label + ": " + failure;
        continue;
      }
      size_t at = 0;
      while (at < rendered.size() && at < expected.size() && rendered[at] == expected[at]) ++at;
      scores[t].first_difference = label + " at byte " + std::to_string(at) +
                                   ": the template writes " + Excerpt(rendered, at) + ", " +
                                   ChatTemplateNames()[t] + " writes " + Excerpt(expected, at);
    }
  }
  for (size_t t = 0; t < scores.size(); ++t) {
    if (scores[t].matched == probes.size()) {
      result.name = ChatTemplateNames()[t];
      return result;
    }
  }
  size_t closest = 0;
  for (size_t t = 1; t < scores.size(); ++t)
    if (scores[t].matched > scores[closest].matched) closest = t;
  result.refusal = source + ": chat_template is not one of " + names + " (the closest, " +
                   ChatTemplateNames()[closest] + ", differs on " +
                   scores[closest].first_difference + ")" + suffix;
  return result;
}

}  // namespace crucible
