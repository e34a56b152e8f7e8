#include "data/file_list.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {

std::vector<FileListEntry> ReadFileList(const std::string& path) {
  const std::string missing = StatFailure(path);
  if (!missing.empty()) throw UsageError(path + ": file list not found: " + missing);
  return ParseFileList(ReadConfigFile(path), path);
}

std::vector<FileListEntry> ParseFileList(const std::string& text, const std::string& path) {
  const std::string folder = ParentDirectory(path);
  std::vector<FileListEntry> entries;
  int line_number = 0;
  for (const std::string& raw : Split(text, '\n')) {
    ++line_number;
    const std::string line = Trim(raw);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = path + ":" + std::to_string(line_number);
    std::istringstream fields(line);
    std::vector<std::string> parts;
    for (std::string field; fields >> field;) parts.push_back(field);
    if (parts.size() < 2 || parts.size() > 3)
      throw DataError(where + ": expected `weight prefix [corpus]`, got " +
                      std::to_string(parts.size()) + " field(s)");
    FileListEntry entry;
    entry.where = where;
    char* end = nullptr;
    entry.weight = std::strtod(parts[0].c_str(), &end);
    if (end == parts[0].c_str() || *end != '\0')
      throw DataError(where + ": weight '" + parts[0] + "' is not a number");
    if (!std::isfinite(entry.weight) || entry.weight <= 0)
      throw DataError(where + ": weight " + parts[0] + " must be a positive finite number");
    std::string prefix = parts[1];
    if (EndsWith(prefix, ".bin") || EndsWith(prefix, ".idx")) prefix.resize(prefix.size() - 4);
    entry.prefix = JoinPath(folder, prefix);
    if (parts.size() == 3) {
      entry.corpus = parts[2];
    } else {
      entry.corpus = prefix.substr(prefix.find_last_of('/') + 1);
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) throw DataError(path + ": the file list names no datasets");
  if (entries.size() > 65535) throw DataError(path + ": more than 65535 datasets in one blend");
  return entries;
}

}  // namespace crucible
