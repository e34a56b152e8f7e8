// Jinja's lexer for chat templates: see jinja_lexer.h. The rules and their order are
// jinja2/lexer.py's (root, comment, block, variable and raw states; braces balanced before an end
// tag is taken).
#include "sft/jinja_lexer.h"

#include <cerrno>
#include <cstring>

#include "tokenizer/utf8.h"

namespace crucible::jinja {
namespace {

bool IsSpaceAt(std::string_view s, size_t pos, size_t* length) {
  size_t next = pos;
  uint32_t c = NextCodepoint(s, &next);
  *length = next - pos;
  return IsPythonSpace(c);
}

// Python's str.rstrip(): trailing whitespace of `text`.
std::string RstripPython(const std::string& text) {
  return PythonStrip(text, nullptr, false, true);
}

// Skips whitespace (\s*) from pos; returns the new position.
size_t SkipSpace(std::string_view s, size_t pos) {
  size_t length;
  while (pos < s.size() && IsSpaceAt(s, pos, &length)) pos += length;
  return pos;
}

int CountNewlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Python's unicode-escape decoding of a string literal's body (after Jinja turned every
// non-ASCII character into a backslash escape first, which this reproduces).
std::string DecodeString(std::string_view body, int line) {
  std::string out;
  auto hex = [&](size_t pos, int digits) -> int64_t {
    if (pos + static_cast<size_t>(digits) > body.size())
      throw Error(Error::kSyntax, line, "truncated \\x, \\u or \\U escape in a string literal");
    int64_t value = 0;
    for (int i = 0; i < digits; ++i) {
      char c = body[pos + static_cast<size_t>(i)];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        throw Error(Error::kSyntax, line, "truncated \\x, \\u or \\U escape in a string literal");
      value = value * 16 + d;
    }
    return value;
  };
  auto append = [&](int64_t codepoint) {
    if (codepoint > 0x10ffff)
      throw Error(Error::kSyntax, line, "illegal Unicode character in a string literal");
    if (codepoint >= 0xd800 && codepoint <= 0xdfff)
      throw Error(Error::kUnsupported, line, "a lone surrogate escape in a string literal");
    AppendUtf8(static_cast<uint32_t>(codepoint), &out);
  };
  for (size_t i = 0; i < body.size();) {
    unsigned char c = static_cast<unsigned char>(body[i]);
    if (c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (i + 1 >= body.size()) throw Error(Error::kSyntax, line, "\\ at end of a string literal");
    char e = body[i + 1];
    i += 2;
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        append(hex(i, 2));
        i += 2;
        break;
      case 'u':
        append(hex(i, 4));
        i += 4;
        break;
      case 'U':
        append(hex(i, 8));
        i += 8;
        break;
      case 'N':
        throw Error(Error::kUnsupported, line, "a \\N{...} escape in a string literal");
      default:
        if (e >= '0' && e <= '7') {
          int64_t value = e - '0';
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k, ++i)
            value = value * 8 + (body[i] - '0');
          append(value);
        } else if (static_cast<unsigned char>(e) >= 0x80) {
          // '\é' reached Python's decoder as '\\xe9': a backslash, then the escape as text.
          size_t pos = i - 1;
          uint32_t cp = NextCodepoint(body, &pos);
          char buffer[16];
          std::snprintf(buffer, sizeof(buffer),
                        cp < 0x100     ? "\\x%02x"
                        : cp < 0x10000 ? "\\u%04x"
                                       : "\\U%08x",
                        cp);
          out += buffer;
          i = pos;
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexOptions& options) : options_(options) {
    // Newlines: \r\n and \r read as \n; one trailing newline dropped (keep_trailing_newline off).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        source_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        source_ += source[i];
      }
    }
    if (!options.keep_trailing_newline && !source_.empty() && source_.back() == '\n')
      source_.pop_back();
  }

  std::vector<Token> Tokenize() {
    bool line_starting = true;
    size_t pos = 0;
    const std::string_view s = source_;
    while (pos < s.size()) {
      size_t tag = FindTag(pos);
      if (tag == std::string::npos) {
        Emit(Token::kText, std::string(s.substr(pos)));
        break;
      }
      std::string text(s.substr(pos, tag - pos));
      char kind = s[tag + 1];
      size_t after = tag + 2;
      char sign = after < s.size() && (s[after] == '-' || s[after] == '+') ? s[after] : 0;
      if (sign) ++after;
      size_t raw_end = 0;
      bool raw = kind == '%' && MatchRawBegin(tag, &raw_end);
      if (raw) sign = s[tag + 2] == '-' || s[tag + 2] == '+' ? s[tag + 2] : 0;
      text = StripBefore(text, sign, kind != '{', line_starting);
      if (!text.empty()) Emit(Token::kText, text);
      line_ += CountNewlines(s.substr(pos, tag - pos));
      if (raw) {
        pos = LexRaw(raw_end, &line_starting);
      } else if (kind == '#') {
        pos = LexComment(after, &line_starting);
      } else {
        Emit(kind == '{' ? Token::kVarBegin : Token::kBlockBegin, "");
        pos = LexTag(after, kind == '{', &line_starting);
      }
    }
    Emit(Token::kEof, "");
    return std::move(tokens_);
  }

 private:
  size_t FindTag(size_t pos) const {
    for (size_t i = source_.find('{', pos); i != std::string::npos; i = source_.find('{', i + 1))
      if (i + 1 < source_.size() && std::strchr("{%#", source_[i + 1]) && source_[i + 1]) return i;
    return std::string::npos;
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}) at `tag`; *end is just past it.
  bool MatchRawBegin(size_t tag, size_t* end) const {
    std::string_view s = source_;
    size_t p = tag + 2;
    if (p < s.size() && (s[p] == '-' || s[p] == '+')) ++p;
    p = SkipSpace(s, p);
    if (s.substr(p, 3) != "raw") return false;
    p = SkipSpace(s, p + 3);
    if (s.substr(p, 3) == "-%}") {
      *end = SkipSpace(s, p + 3);
      return true;
    }
    if (s.substr(p, 2) == "%}") {
      *end = p + 2;
      return true;
    }
    return false;
  }

  // The whitespace control of the text before a tag: `-` strips all trailing whitespace;
  // otherwise, for a block or comment tag with lstrip_blocks, whitespace between the line's
  // start and the tag.
  std::string StripBefore(const std::string& text, char sign, bool lstrip_kind,
                          bool line_starting) const {
    if (sign == '-') return RstripPython(text);
    if (sign == '+' || !options_.lstrip_blocks || !lstrip_kind) return text;
    size_t line_start = text.rfind('\n');
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    if (line_start == 0 && !line_starting) return text;
    if (line_start == text.size()) return text;
    for (size_t p = line_start, length; p < text.size(); p += length)
      if (!IsSpaceAt(text, p, &length)) return text;
    return text.substr(0, line_start);
  }

  // The end of a block (`%}`) or comment (`#}`): `+%}`, `-%}` and the whitespace after it, or
  // `%}` and, with trim_blocks, one newline. Returns the position after it, or npos.
  size_t MatchBlockEnd(size_t p, char close) const {
    std::string_view s = source_;
    const char end[3] = {close, '}', 0};
    if (s.substr(p, 1) == "+" && s.substr(p + 1, 2) == end) return p + 3;
    if (s.substr(p, 1) == "-" && s.substr(p + 1, 2) == end) return SkipSpace(s, p + 3);
    if (s.substr(p, 2) == end) {
      p += 2;
      if (options_.trim_blocks && p < s.size() && s[p] == '\n') ++p;
      return p;
    }
    return std::string::npos;
  }

  size_t LexComment(size_t p, bool* line_starting) {
    for (size_t i = p; i < source_.size(); ++i) {
      size_t end = MatchBlockEnd(i, '#');
      if (end == std::string::npos) continue;
      line_ += CountNewlines(std::string_view(source_).substr(p, end - p));
      *line_starting = source_[end - 1] == '\n';
      return end;
    }
    throw Error(Error::kSyntax, line_, "missing end of comment tag");
  }

  size_t LexRaw(size_t p, bool* line_starting) {
    std::string_view s = source_;
    for (size_t i = s.find("{%", p); i != std::string::npos; i = s.find("{%", i + 1)) {
      size_t q = i + 2;
      char sign = q < s.size() && (s[q] == '-' || s[q] == '+') ? s[q] : 0;
      if (sign) ++q;
      q = SkipSpace(s, q);
      if (s.substr(q, 6) != "endraw") continue;
      size_t end = MatchBlockEnd(SkipSpace(s, q + 6), '%');
      if (end == std::string::npos) continue;
      std::string text = StripBefore(std::string(s.substr(p, i - p)), sign, true, *line_starting);
      if (!text.empty()) Emit(Token::kText, text);
      line_ += CountNewlines(s.substr(p, end - p));
      *line_starting = s[end - 1] == '\n';
      return end;
    }
    throw Error(Error::kSyntax, line_, "missing end of raw directive");
  }

  // The tokens of a {{ }} or {% %} tag from p; returns the position after its end.
  size_t LexTag(size_t p, bool variable, bool* line_starting) {
    std::string_view s = source_;
    std::vector<char> balance;
    while (true) {
      if (p >= s.size())
        throw Error(Error::kSyntax, line_,
                    variable ? "unexpected end of template, expected '}}'"
                             : "unexpected end of template, expected '%}'");
      if (balance.empty()) {
        size_t end = variable ? (s.substr(p, 3) == "-}}"  ? SkipSpace(s, p + 3)
                                 : s.substr(p, 2) == "}}" ? p + 2
                                                          : std::string::npos)
                              : MatchBlockEnd(p, '%');
        if (end != std::string::npos) {
          Emit(variable ? Token::kVarEnd : Token::kBlockEnd, "");
          line_ += CountNewlines(s.substr(p, end - p));
          *line_starting = s[end - 1] == '\n';
          return end;
        }
      }
      size_t length;
      if (IsSpaceAt(s, p, &length)) {
        line_ += s[p] == '\n';
        p += length;
        continue;
      }
      char c = s[p];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        p = LexNumber(p);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t start = p;
        while (p < s.size() && (std::isalnum(static_cast<unsigned char>(s[p])) || s[p] == '_')) ++p;
        Emit(Token::kName, std::string(s.substr(start, p - start)));
      } else if (c == '\'' || c == '"') {
        size_t start = p++;
        while (p < s.size() && s[p] != c) p += s[p] == '\\' ? 2 : 1;
        if (p >= s.size())
          throw Error(Error::kSyntax, line_, "unexpected char '" + std::string(1, c) + "'");
        ++p;
        Emit(Token::kString, DecodeString(s.substr(start + 1, p - start - 2), line_));
        line_ += CountNewlines(s.substr(start, p - start));
      } else {
        static const char* kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        std::string op;
        for (const char* candidate : kOperators)
          if (s.substr(p, std::strlen(candidate)) == candidate) {
            op = candidate;
            break;
          }
        if (op.empty())
          throw Error(Error::kSyntax, line_, "unexpected char '" + std::string(1, c) + "'");
        if (op == "(" || op == "[" || op == "{")
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) throw Error(Error::kSyntax, line_, "unexpected '" + op + "'");
          if (balance.back() != op[0])
            throw Error(Error::kSyntax, line_,
                        "unexpected '" + op + "', expected '" + balance.back() + "'");
          balance.pop_back();
        }
        Emit(Token::kOp, op);
        p += op.size();
      }
    }
  }

  // An integer or float literal at p (digits with _ separators, 0x/0o/0b, exponents).
  size_t LexNumber(size_t p) {
    std::string_view s = source_;
    auto digits = [&](size_t q, auto is_digit) {
      size_t start = q;
      while (q < s.size() && (is_digit(s[q]) ||
                              (s[q] == '_' && q > start && q + 1 < s.size() && is_digit(s[q + 1]))))
        ++q;
      return q;
    };
    auto decimal = [](char c) { return c >= '0' && c <= '9'; };
    bool after_dot = p > 0 && s[p - 1] == '.';
    size_t q = digits(p, decimal);
    size_t float_end = std::string::npos;
    if (!after_dot) {
      size_t f = q;
      if (f + 1 < s.size() && s[f] == '.' && decimal(s[f + 1])) f = digits(f + 1, decimal);
      if (f < s.size() && (s[f] == 'e' || s[f] == 'E')) {
        size_t e = f + 1;
        if (e < s.size() && (s[e] == '+' || s[e] == '-')) ++e;
        if (e < s.size() && decimal(s[e])) float_end = digits(e, decimal);
      }
      if (float_end == std::string::npos && f != q) float_end = f;
    }
    if (float_end != std::string::npos) {
      std::string text;
      for (char c : s.substr(p, float_end - p))
        if (c != '_') text += c;
      Token token{Token::kFloat, text, Value(std::strtod(text.c_str(), nullptr)), line_};
      tokens_.push_back(token);
      return float_end;
    }
    int base = 10;
    size_t start = p;
    if (s[p] == '0' && p + 1 < s.size() && std::strchr("xXoObB", s[p + 1]) && s[p + 1]) {
      char b = static_cast<char>(std::tolower(static_cast<unsigned char>(s[p + 1])));
      base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
      start = p + 2;
      q = start;
      while (q < s.size() && (std::isxdigit(static_cast<unsigned char>(s[q])) || s[q] == '_')) ++q;
    }
    std::string text;
    for (char c : s.substr(start, q - start))
      if (c != '_') text += c;
    errno = 0;
    char* end = nullptr;
    long long value = std::strtoll(text.c_str(), &end, base);
    if (text.empty() || *end) throw Error(Error::kSyntax, line_, "invalid integer literal");
    if (errno == ERANGE)
      throw Error(Error::kUnsupported, line_, "an integer literal beyond 64 bits");
    tokens_.push_back(Token{Token::kInt, text, Value(static_cast<int64_t>(value)), line_});
    return q;
  }

  void Emit(Token::Kind kind, std::string value) {
    tokens_.push_back(Token{kind, std::move(value), Value(), line_});
  }

  LexOptions options_;
  std::string source_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source, const LexOptions& options) {
  Lexer lexer(source, options);
  return lexer.Tokenize();
}

}  // namespace crucible::jinja
