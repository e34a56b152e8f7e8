#include "launch/hostlist.h"

#include <cctype>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

// Splits at commas that are not inside brackets.
std::vector<std::string> SplitTopLevel(std::string_view list) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string current;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw UsageError("host list '" + std::string(list) + "': unbalanced ']'");
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) throw UsageError("host list '" + std::string(list) + "': unbalanced '['");
  parts.push_back(current);
  return parts;
}

bool AllDigits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// Expands the first bracket group of `name` and recurses on the rest.
void ExpandName(const std::string& name, std::string_view whole, std::vector<std::string>* out) {
  size_t open = name.find('[');
  if (open == std::string::npos) {
    out->push_back(name);
    return;
  }
  size_t close = name.find(']', open);
  const std::string prefix = name.substr(0, open);
  const std::string suffix = name.substr(close + 1);
  const std::string ranges = name.substr(open + 1, close - open - 1);
  for (const std::string& range : Split(ranges, ',')) {
    std::string low = Trim(range), high = low;
    size_t dash = low.find('-');
    if (dash != std::string::npos) {
      high = low.substr(dash + 1);
      low = low.substr(0, dash);
    }
    if (!AllDigits(low) || !AllDigits(high))
      throw UsageError("host list '" + std::string(whole) + "': bad range '" + range + "'");
    const long first = std::stol(low), last = std::stol(high);
    if (last < first)
      throw UsageError("host list '" + std::string(whole) + "': range '" + range +
                       "' runs backwards");
    if (last - first > 100000)
      throw UsageError("host list '" + std::string(whole) + "': range '" + range +
                       "' is too large");
    for (long i = first; i <= last; ++i) {
      std::string number = std::to_string(i);
      if (number.size() < low.size()) number.insert(0, low.size() - number.size(), '0');
      ExpandName(prefix + number + suffix, whole, out);
    }
  }
}

}  // namespace

std::vector<std::string> ExpandHostList(std::string_view list) {
  std::vector<std::string> hosts;
  for (const std::string& part : SplitTopLevel(list)) {
    std::string name = Trim(part);
    if (name.empty()) continue;
    ExpandName(name, list, &hosts);
  }
  return hosts;
}

std::vector<std::string> ReadHostFile(const std::string& path) {
  std::string text;
  try {
    text = ReadConfigFile(path);
  } catch (const Error& e) {
    throw UsageError("cannot read host file " + path + ": " + e.what());
  }
  std::vector<std::string> hosts;
  for (const std::string& raw : Split(text, '\n')) {
    std::string line = Trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::string host = line.substr(0, line.find_first_of(" \t:"));
    if (FindHost(hosts, host) < 0) hosts.push_back(host);
  }
  if (hosts.empty()) throw UsageError("host file " + path + " names no host");
  return hosts;
}

std::string NormalizeHost(std::string_view host) {
  std::string name = Trim(host);
  const char* punctuation = "\"'`()[]<>{},;:";
  size_t begin = name.find_first_not_of(punctuation);
  size_t end = name.find_last_not_of(punctuation);
  name = begin == std::string::npos ? "" : name.substr(begin, end - begin + 1);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t dot = name.find('.');
  if (dot != std::string::npos && !AllDigits(name.substr(0, dot))) name.resize(dot);
  return name;
}

int FindHost(const std::vector<std::string>& hosts, std::string_view host) {
  const std::string wanted = NormalizeHost(host);
  for (size_t i = 0; i < hosts.size(); ++i)
    if (NormalizeHost(hosts[i]) == wanted) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> ReadExcludeFile(const std::string& path) {
  std::vector<std::string> hosts;
  for (const std::string& raw : Split(ReadConfigFile(path), '\n')) {
    const std::string line = Trim(raw);
    if (line.empty() || line[0] == '#') continue;
    const std::string host = line.substr(0, line.find_first_of(" \t"));
    if (FindHost(hosts, host) < 0) hosts.push_back(host);
  }
  return hosts;
}

std::string JoinHosts(const std::vector<std::string>& hosts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (i) out += separator;
    out += hosts[i];
  }
  return out;
}

}  // namespace crucible
