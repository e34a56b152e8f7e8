// The tokens of a Jinja template, as Jinja's lexer (jinja2/lexer.py) cuts them: newlines
// normalised to \n, one trailing newline dropped, the whitespace control of {%- -%} {{- -}} {#- -#}
// and {%+, trim_blocks (the newline after a block or comment tag goes) and lstrip_blocks (spaces
// and tabs before a block or comment tag that starts its line go), {% raw %} kept as text, string
// literals decoded as Python's unicode-escape. Internal to the parser (jinja_parse.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sft/jinja_value.h"

namespace crucible::jinja {

struct LexOptions {
  bool trim_blocks = true;  // Hugging Face's settings (transformers' chat template environment)
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

struct Token {
  enum Kind {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Kind kind;
  std::string value;  // text, name, decoded string, operator
  Value number;
  int line;
};

// The tokens of `source` (valid UTF-8), ending with kEof; throws Error (kSyntax, kUnsupported)
// naming the line.
std::vector<Token> Tokenize(std::string_view source, const LexOptions& options);

}  // namespace crucible::jinja
