#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "common/error.h"

namespace crucible {

std::string TranslateOnigurumaPattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[i + 1];
      ++i;
      if (next == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (next == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        // \S inside a class cannot be widened the same way; it stays PCRE2's \S.
        out += '\\';
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

RegexScratch::RegexScratch() {
  match_data_ = pcre2_match_data_create(1, nullptr);
  match_context_ = pcre2_match_context_create(nullptr);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (jit_stack_)
    pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(match_context_), nullptr, jit_stack_);
}

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  if (jit_stack_) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

Regex::Regex(const std::string& pattern, const std::string& where)
    : where_(where), translated_(TranslateOnigurumaPattern(pattern)) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated_.data()), translated_.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw DataError(where + ": unsupported pre-tokenizer regex '" + pattern +
                    "' (PCRE2: " + reinterpret_cast<const char*>(message) + " at offset " +
                    std::to_string(error_offset) + ")");
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::Find(std::string_view text, size_t from, RegexScratch& scratch, size_t* start,
                 size_t* end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* data = static_cast<pcre2_match_data*>(scratch.match_data_);
  auto* context = static_cast<pcre2_match_context*>(scratch.match_context_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The caller guarantees valid UTF-8; PCRE2's own check would rescan the whole text per call.
  int rc =
      jit_ ? pcre2_jit_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, data, context)
           : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, data, context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw DataError(where_ + ": pre-tokenizer regex failed on the input (PCRE2: " +
                    reinterpret_cast<const char*>(message) + ")");
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  *start = ovector[0];
  *end = ovector[1];
  return true;
}

}  // namespace crucible
