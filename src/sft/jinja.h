// A Jinja interpreter for chat templates: the subset of Jinja 3 that Hugging Face chat templates
// use, run the way transformers runs them (trim_blocks and lstrip_blocks on, autoescape off, its
// `tojson`, `raise_exception` and `namespace`), so that a template's rendering here equals
// tokenizer.apply_chat_template(..., tokenize=False) byte for byte.
//
// Supported: {% if/elif/else %}, {% for %} (tuple targets, `if` filter, else, loop.index/index0/
// revindex/revindex0/first/last/length/previtem/nextitem/cycle, break/continue), {% set %} (names,
// tuples, namespace attributes, blocks), {% macro %} and calls, {% filter %}, {% with %},
// {% raw %}, {% generation %}; expressions with literals, lists, tuples, dicts, attributes,
// subscripts and slices, calls, and/or/not, comparisons, in, is [not] <test>, + - * / // % ** ~,
// and `a if b else c`; the filters, tests and globals of jinja_filters.cc and the str and dict
// methods of jinja_methods.cc.
// Anything else is Error::kUnsupported naming the construct, never a crash: nesting, loop steps
// and output size are capped (Error::kLimit).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "sft/jinja_parse.h"
#include "sft/jinja_value.h"

namespace crucible::jinja {

struct RenderLimits {
  int64_t max_steps = 20'000'000;  // expressions evaluated and statements run
  size_t max_output_bytes = size_t{64} << 20;
  int max_call_depth = 64;  // macro calls within macro calls
};

class Template {
 public:
  // Parses `source`; throws Error (kSyntax, kUnsupported, kLimit).
  static Template Parse(std::string_view source, const LexOptions& options = {});

  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, ...)
  // beside the globals: range, dict, namespace, raise_exception. Throws Error.
  std::string Render(const nlohmann::ordered_json& variables,
                     const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace crucible::jinja
