#include "launch/bad_node_patterns.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdlib>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {

struct BadNodePatterns::Pattern {
  std::string name;
  pcre2_code* code = nullptr;
  uint32_t host_group = 0;  // 0: the regex has no (?<host>...)
  uint32_t rank_group = 0;
  ~Pattern() { pcre2_code_free(code); }
};

namespace {
const char kDefaultPatterns[] =
#include "bad_node_patterns.inc"
    ;

constexpr uint32_t kMaxGroups = 32;

uint32_t GroupNumber(const pcre2_code* code, const char* name) {
  int number = pcre2_substring_number_from_name(code, reinterpret_cast<PCRE2_SPTR>(name));
  return number > 0 && static_cast<uint32_t>(number) < kMaxGroups ? static_cast<uint32_t>(number)
                                                                  : 0;
}
}  // namespace

BadNodePatterns BadNodePatterns::Defaults() {
  BadNodePatterns patterns;
  patterns.AddText(kDefaultPatterns, "built-in bad_node_patterns.txt");
  return patterns;
}

void BadNodePatterns::AddFile(const std::string& path) {
  std::string text;
  try {
    text = ReadConfigFile(path);
  } catch (const Error& e) {
    throw UsageError("cannot read bad-node pattern file " + path + ": " + e.what());
  }
  AddText(text, path);
}

void BadNodePatterns::AddText(std::string_view text, const std::string& origin) {
  const std::vector<std::string> lines = Split(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = Trim(lines[i]);
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.find_first_of(" \t");
    std::string regex = space == std::string::npos ? "" : Trim(line.substr(space));
    if (regex.empty())
      throw UsageError(StrFormat("%s:%zu: expected 'name regex', got '%s'", origin.c_str(), i + 1,
                                 line.c_str()));
    auto pattern = std::make_shared<Pattern>();
    pattern->name = line.substr(0, space);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pattern->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(), 0,
                                  &error_code, &error_offset, nullptr);
    if (!pattern->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      throw UsageError(StrFormat("%s:%zu: invalid regex in pattern '%s' at offset %zu: %s",
                                 origin.c_str(), i + 1, pattern->name.c_str(),
                                 static_cast<size_t>(error_offset),
                                 reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(pattern->code,
                      PCRE2_JIT_COMPLETE);  // best effort: falls back to the interpreter
    pattern->host_group = GroupNumber(pattern->code, "host");
    pattern->rank_group = GroupNumber(pattern->code, "rank");
    patterns_.push_back(std::move(pattern));
  }
}

std::optional<BadNodePatterns::Match> BadNodePatterns::Find(std::string_view line) const {
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create(kMaxGroups, nullptr), pcre2_match_data_free);
  for (const auto& pattern : patterns_) {
    int rc = pcre2_match(pattern->code, reinterpret_cast<PCRE2_SPTR>(line.data()), line.size(), 0,
                         0, data.get(), nullptr);
    if (rc < 0) continue;          // no match (or a match error, which blames nobody)
    if (rc == 0) rc = kMaxGroups;  // ovector too small: every group we read still fits
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    auto group = [&](uint32_t number) -> std::string {
      if (number == 0 || number >= static_cast<uint32_t>(rc) || ovector[2 * number] == PCRE2_UNSET)
        return "";
      return std::string(
          line.substr(ovector[2 * number], ovector[2 * number + 1] - ovector[2 * number]));
    };
    Match match;
    match.pattern = pattern->name;
    match.host = group(pattern->host_group);
    std::string rank = group(pattern->rank_group);
    if (!rank.empty()) match.rank = static_cast<int>(std::strtol(rank.c_str(), nullptr, 10));
    return match;
  }
  return std::nullopt;
}

}  // namespace crucible
