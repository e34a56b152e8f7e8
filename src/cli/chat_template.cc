// crucible chat-template render|detect: conversations rendered with a named chat template (or
// any Jinja template, through crucible's interpreter), and which named template a
// tokenizer_config.json carries, judged by rendering (sft/chat_template.h, docs/post-training.md).
#include "sft/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "common/lines.h"
#include "common/log.h"
#include "common/strings.h"
#include "sft/jinja.h"

namespace crucible {
namespace {

struct ChatTemplateOptions {
  std::string template_name, jinja_path, tokenizer_config, input = "-", target;
  std::string bos_token, eos_token;
  bool bos_given = false, eos_given = false;
};

std::string ReadInput(const std::string& path) {
  if (path != "-") return ReadFile(path);
  std::string text;
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(STDIN_FILENO, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      ThrowErrno("cannot read stdin");
    }
    if (n == 0) return text;
    text.append(buffer, static_cast<size_t>(n));
  }
}

std::string Dump(const nlohmann::ordered_json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
}

int RunRender(const ChatTemplateOptions& o) {
  if (o.template_name.empty() == o.jinja_path.empty())
    throw UsageError("chat-template render: give one of --template NAME or --jinja FILE");
  if (!o.template_name.empty()) CheckChatTemplateName(o.template_name);
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  if (!o.tokenizer_config.empty())
    special = ReadTokenizerChatConfig(o.tokenizer_config).special_tokens;
  if (o.bos_given) special["bos_token"] = o.bos_token;
  if (o.eos_given) special["eos_token"] = o.eos_token;
  ChatTokens tokens;
  if (special.contains("bos_token")) tokens.bos_token = special["bos_token"].get<std::string>();
  if (special.contains("eos_token")) tokens.eos_token = special["eos_token"].get<std::string>();
  std::unique_ptr<jinja::Template> jinja_template;
  if (!o.jinja_path.empty()) {
    try {
      jinja_template =
          std::make_unique<jinja::Template>(jinja::Template::Parse(ReadConfigFile(o.jinja_path)));
    } catch (const jinja::Error& e) {
      throw UsageError(o.jinja_path + (e.line() ? ":" + std::to_string(e.line()) : "") + ": " +
                       (e.kind() == jinja::Error::kUnsupported ? "unsupported: " : "") + e.what());
    }
  }
  const std::string name = o.input == "-" ? "<stdin>" : o.input;
  const std::string text = ReadInput(o.input);
  LineSplitter lines(text);
  bool any_failed = false;
  for (std::string_view line; lines.Next(&line);) {
    if (Trim(line).empty()) continue;
    const std::string where = name + ":" + std::to_string(lines.line_number());
    nlohmann::ordered_json record;
    try {
      record = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!record.is_object() || (!jinja_template && !record.contains("messages")))
      throw DataError(where + ": expected an object with \"messages\"");
    auto agp = record.find("add_generation_prompt");
    if (agp != record.end() && !agp->is_boolean())
      throw DataError(where + ": \"add_generation_prompt\" is not true or false");
    const bool add_generation_prompt = agp != record.end() && agp->get<bool>();
    nlohmann::ordered_json out;
    if (jinja_template) {  // every key of the line is a template variable, beside the tokens
      nlohmann::ordered_json variables = special;
      for (const auto& [key, value] : record.items()) variables[key] = value;
      if (agp == record.end()) variables["add_generation_prompt"] = false;
      try {
        out["text"] = jinja_template->Render(variables);
      } catch (const jinja::Error& e) {
        static const char* kKinds[] = {"syntax", "unsupported", "runtime", "raised", "limit"};
        out["error"] = e.what();
        out["kind"] = kKinds[e.kind()];
        any_failed = true;
      }
    } else {
      ChatRendering rendering =
          RenderChat(o.template_name, ChatMessagesFromJson(record["messages"], where),
                     add_generation_prompt, tokens, where);
      out["text"] = rendering.text;
      out["assistant_spans"] = rendering.assistant_spans;
    }
    PrintLine(Dump(out));
  }
  return any_failed ? kExitBadData : kExitOk;
}

int RunDetect(const ChatTemplateOptions& o) {
  TokenizerChatConfig config;
  if (EndsWith(o.target, ".jinja")) {
    config.chat_template = ReadConfigFile(o.target);
    config.has_chat_template = true;
  } else {
    config = ReadTokenizerChatConfig(o.target);
  }
  if (o.bos_given) config.special_tokens["bos_token"] = o.bos_token;
  if (o.eos_given) config.special_tokens["eos_token"] = o.eos_token;
  if (!config.has_chat_template)
    throw UsageError(o.target + ": no chat_template; pass --chat-template NAME (one of " +
                     ChatTemplateNameList() + ")");
  ChatTemplateMatch match =
      MatchChatTemplate(config.chat_template, config.special_tokens, o.target);
  if (match.name.empty()) throw UsageError(match.refusal);
  PrintLine("chat_template=" + match.name +
            " probes=" + std::to_string(ChatTemplateProbes().size()) + " source=" + o.target);
  return kExitOk;
}

CommandRun SetupChatTemplate(CLI::App& app) {
  auto o = std::make_shared<ChatTemplateOptions>();
  app.require_subcommand(1);
  app.footer("Named templates: " + ChatTemplateNameList() +
             ". See docs/post-training.md, \"Chat templates\".");
  CLI::App* render = app.add_subcommand(
      "render",
      "render conversations (jsonl on stdin, one {\"messages\": [{\"role\", \"content\"}...], "
      "\"add_generation_prompt\": bool} per line) as one JSON line each: {\"text\", "
      "\"assistant_spans\": "
      "[[begin, end] byte ranges the SFT loss trains on]}");
  render->add_option("-t,--template", o->template_name,
                     "a named template: " + ChatTemplateNameList());
  render->add_option(
      "--jinja", o->jinja_path,
      "render with this Jinja file through crucible's interpreter instead (every key of a "
      "line is a template variable; no spans; a line the template fails on is written as "
      "{\"error\", \"kind\"} and the exit status is 65)");
  render->add_option(
      "--tokenizer-config", o->tokenizer_config,
      "take bos_token, eos_token and the other special tokens from this tokenizer_config.json");
  render->add_option("--bos-token", o->bos_token, "the bos_token string")
      ->each([o](const std::string&) { o->bos_given = true; });
  render->add_option("--eos-token", o->eos_token, "the eos_token string")
      ->each([o](const std::string&) { o->eos_given = true; });
  render->add_option("-i,--input", o->input, "read conversations from this file instead of stdin");
  CLI::App* detect = app.add_subcommand(
      "detect",
      "say which named template a tokenizer_config.json's chat_template is, by rendering probe "
      "conversations with both (exit 0: chat_template=NAME), or refuse in one line (exit 2)");
  detect->add_option("FILE", o->target, "tokenizer_config.json (or a .jinja template file)")
      ->required();
  detect->add_option("--bos-token", o->bos_token, "the bos_token string (default: the file's)")
      ->each([o](const std::string&) { o->bos_given = true; });
  detect->add_option("--eos-token", o->eos_token, "the eos_token string (default: the file's)")
      ->each([o](const std::string&) { o->eos_given = true; });
  return [o, render, detect]() {
    if (render->parsed()) return RunRender(*o);
    if (detect->parsed()) return RunDetect(*o);
    return static_cast<int>(kExitUsage);
  };
}

CommandRegistrar chat_template_registrar(
    "chat-template",
    "render conversations with a chat template (llama3, chatml, deepseek-v3); detect a "
    "tokenizer_config.json's template by its rendering",
    SetupChatTemplate);

}  // namespace
}  // namespace crucible
