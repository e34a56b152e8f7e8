// The named templates' markers and crucible's own Jinja for them (chat_template_jinja.h).
#include "sft/chat_template_jinja.h"

#include <map>

#include "common/error.h"
#include "sft/chat_template.h"

namespace crucible {
namespace {

struct TemplateFacts {
  std::vector<std::string> markers;
  std::string end_of_turn, jinja;
};

const TemplateFacts& Facts(const std::string& name) {
  static const std::map<std::string, TemplateFacts> facts = {
      {"llama3",
       {{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
        "<|eot_id|>",
        // bos_token once, before the first turn; each turn's content stripped.
        "{% if messages | length > 0 %}{{ bos_token }}{% endif %}"
        "{% for turn in messages %}"
        "{{ '<|start_header_id|>' ~ turn['role'] ~ '<|end_header_id|>\\n\\n' ~ "
        "(turn['content'] | trim) ~ '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' "
        "}}{% endif %}"}},
      {"chatml",
       {{"<|im_start|>", "<|im_end|>"},
        "<|im_end|>",
        "{% for turn in messages %}"
        "{{ '<|im_start|>' ~ turn['role'] ~ '\\n' ~ turn['content'] ~ '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"}},
      {"deepseek-v3",
       {{"<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"},
        "<｜end▁of▁sentence｜>",
        // bos_token, then every system turn's content (a blank line between them), then the
        // user and assistant turns in order.
        "{{ bos_token }}"
        "{% set state = namespace(separator='') %}"
        "{% for turn in messages %}{% if turn['role'] == 'system' %}"
        "{{ state.separator ~ turn['content'] }}{% set state.separator = '\\n\\n' %}"
        "{% endif %}{% endfor %}"
        "{% for turn in messages %}"
        "{% if turn['role'] == 'user' %}{{ '<｜User｜>' ~ turn['content'] }}"
        "{% elif turn['role'] == 'assistant' %}"
        "{{ '<｜Assistant｜>' ~ turn['content'] ~ '<｜end▁of▁sentence｜>' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"}},
  };
  CheckChatTemplateName(name);
  return facts.at(name);
}

}  // namespace

const std::vector<std::string>& ChatTemplateMarkers(const std::string& name) {
  return Facts(name).markers;
}

const std::string& ChatTemplateEndOfTurn(const std::string& name) {
  return Facts(name).end_of_turn;
}

void RequireChatMarkers(const Tokenizer& tokenizer, const std::string& name,
                        const std::string& whose) {
  for (const std::string& marker : ChatTemplateMarkers(name)) {
    const std::vector<uint32_t> ids = tokenizer.Encode(marker);
    if (ids.size() == 1 && tokenizer.TokenToId(marker) == static_cast<int64_t>(ids[0])) continue;
    throw UsageError("the " + name + " chat template writes " + marker +
                     " as one special token, but " + whose + " has no such token (it encodes to " +
                     std::to_string(ids.size()) +
                     " tokens); train the tokenizer with it (crucible tokenizer train --special '" +
                     marker + "' ...), or pass a --chat-template whose markers it has");
  }
}

const std::string& ChatTemplateJinja(const std::string& name) {
  return Facts(name).jinja;
}

}  // namespace crucible
