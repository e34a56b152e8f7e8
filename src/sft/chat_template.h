// Chat templates for supervised fine-tuning: conversations rendered to text exactly as Hugging
// Face's tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
// renders them with a model's reference template, with the byte ranges the SFT loss trains on.
//
// The named templates (their reference Jinja is under tests/golden/chat_templates/):
//   llama3       Meta-Llama-3-8B-Instruct: bos_token before the first message, then per message
//                <|start_header_id|>ROLE<|end_header_id|>\n\n + content.strip() + <|eot_id|>;
//                the generation prompt is <|start_header_id|>assistant<|end_header_id|>\n\n.
//                (Llama 3.1's template, with its "Cutting Knowledge Date" system header and tool
//                calling, is a different template and is not this one.)
//   chatml       plain ChatML (teknium/OpenHermes-2.5-Mistral-7B): <|im_start|>ROLE\n + content +
//                <|im_end|>\n per message; no default system message (Qwen2.5's adds one);
//                the generation prompt is <|im_start|>assistant\n.
//   deepseek-v3  deepseek-ai/DeepSeek-V3: bos_token and the system messages joined by \n\n first,
//                then <｜User｜>content and <｜Assistant｜>content<｜end▁of▁sentence｜>; the
//                generation prompt is <｜Assistant｜>.
// None of the three writes eos_token; each hard-codes its end-of-turn marker.
//
// Detection: a tokenizer_config.json's chat_template (Jinja text) is one of these when it renders
// a fixed set of probe conversations byte for byte as the named template does (sft/jinja.h runs
// it), and is refused in one line otherwise: by its rendering, not its text.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

// The tokenizer's special tokens a template may write ("" when the tokenizer has none).
struct ChatTokens {
  std::string bos_token, eos_token;
};

struct ChatRendering {
  std::string text;
  // Byte ranges [begin, end) of `text` that belong to assistant turns, in order: each assistant
  // message's content as the template writes it (llama3 strips it) and the end-of-turn marker
  // after it (<|eot_id|>, <|im_end|>, <｜end▁of▁sentence｜>; ChatML's "\n" after <|im_end|> is
  // not included). The SFT loss trains on the tokens these ranges cover.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
};

// "llama3", "chatml", "deepseek-v3".
const std::vector<std::string>& ChatTemplateNames();
// The names joined by ", ", for messages.
std::string ChatTemplateNameList();
// Throws UsageError (exit 2) naming the valid names when `name` is not one of them.
void CheckChatTemplateName(const std::string& name);

// Renders a conversation with the named template. An unknown role is a DataError (exit 65):
// "<where>: message <index>: unknown role '<role>' (expected system, user or assistant)".
ChatRendering RenderChat(const std::string& name, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt, const ChatTokens& tokens,
                         const std::string& where = "conversation");

// The messages of a JSON array of {"role": string, "content": string} objects; a DataError naming
// `where` and the message index otherwise.
std::vector<ChatMessage> ChatMessagesFromJson(const nlohmann::json& messages,
                                              const std::string& where);

// What detection needs from a tokenizer_config.json: the chat template (the "default" one when it
// holds a list of named templates; chat_template.jinja beside the file when it has none) and the
// special tokens as transformers passes them to the template.
struct TokenizerChatConfig {
  std::string chat_template;
  bool has_chat_template = false;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // bos_token, ...
};
TokenizerChatConfig ReadTokenizerChatConfig(const std::string& path);

struct ChatTemplateMatch {
  std::string name;     // the named template, or empty when refused
  std::string refusal;  // when refused: "<source>: chat_template is not one of ...; pass
                        // --chat-template NAME"
};

// Renders the probes with `jinja_text` and with each named template and returns the one that
// equals it on every probe, or the refusal naming the closest one, the first probe it differs on
// and where. A Jinja construct the interpreter does not support, a syntax error or a template
// that fails on a probe is a refusal naming it too. Never throws for a bad template.
ChatTemplateMatch MatchChatTemplate(const std::string& jinja_text,
                                    const nlohmann::ordered_json& special_tokens,
                                    const std::string& source);

// The probe conversations, numbered from 1 in messages (each: messages, add_generation_prompt).
struct ChatProbe {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
};
const std::vector<ChatProbe>& ChatTemplateProbes();

}  // namespace crucible
