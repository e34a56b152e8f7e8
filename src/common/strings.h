// Small string helpers: printf-style formatting, splitting, trimming, edit distance.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

std::string StrFormat(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::vector<std::string> Split(std::string_view text, char separator);
std::string Trim(std::string_view text);

// `text` for HTML or XML text and attribute values: & < > " ' as entities.
std::string XmlEscape(std::string_view text);
bool StartsWith(std::string_view text, std::string_view prefix);
bool EndsWith(std::string_view text, std::string_view suffix);
// Levenshtein distance, for "did you mean" suggestions.
size_t EditDistance(std::string_view a, std::string_view b);
// Shortest representation of a float/double that reads back to the same value (%.9g / %.17g).
std::string FormatFloat(float value);
std::string FormatDouble(double value);
// %g, with "nan" whatever its sign bit ("inf", "-inf" as %g writes them): a value in a message.
std::string FormatValue(double value);
std::string HexU64(uint64_t value);
std::string HumanBytes(double bytes);

}  // namespace crucible
