// What a named chat template needs beyond its rendering (sft/chat_template.h): the special
// markers it writes, which a model's tokenizer must hold as single tokens for `crucible generate
// --chat` to encode them as the model was trained; its end-of-turn marker, where generation stops;
// and the Jinja text `crucible export hf` writes into tokenizer_config.json's chat_template.
//
// The Jinja is crucible's own (not the vendors' text): written so that Hugging Face's
// apply_chat_template and crucible's detection (MatchChatTemplate) render system, user and
// assistant conversations exactly as RenderChat does. One line, no literal newlines, so it renders
// the same with or without transformers' trim_blocks/lstrip_blocks.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace crucible {

// The markers `name` writes itself (not bos_token), in the order they appear in a turn:
// llama3 <|start_header_id|> <|end_header_id|> <|eot_id|>; chatml <|im_start|> <|im_end|>;
// deepseek-v3 <｜User｜> <｜Assistant｜> <｜end▁of▁sentence｜>. UsageError for an unknown name.
const std::vector<std::string>& ChatTemplateMarkers(const std::string& name);

// The marker that ends an assistant turn: <|eot_id|>, <|im_end|>, <｜end▁of▁sentence｜>.
const std::string& ChatTemplateEndOfTurn(const std::string& name);

// Throws a one-line UsageError (exit 2) when `tokenizer` does not encode one of `name`'s markers
// as a single token of its own (an added/special token), naming the marker, `whose` ("the
// tokenizer of runs/x") and how to train a tokenizer that has it.
void RequireChatMarkers(const Tokenizer& tokenizer, const std::string& name,
                        const std::string& whose);

// Crucible's Jinja for `name` (uses messages, add_generation_prompt and bos_token).
const std::string& ChatTemplateJinja(const std::string& name);

}  // namespace crucible
