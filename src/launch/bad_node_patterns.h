// The registry of log patterns that name a bad node. The defaults are configs/
// bad_node_patterns.txt, compiled in; sites add files in the same format at run time, so a new
// hardware message never needs a rebuild. File format: see that file's header.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

class BadNodePatterns {
 public:
  // What one line told: the pattern that matched, and the host and/or rank it named (empty /
  // -1 when the pattern has no such group or the group did not take part in the match).
  struct Match {
    std::string pattern;
    std::string host;
    int rank = -1;
  };

  // The compiled-in defaults.
  static BadNodePatterns Defaults();

  // Adds every pattern of a file / of text in the file format. Throws UsageError naming the
  // origin and line for a line without a regex or with a regex PCRE2 rejects.
  void AddFile(const std::string& path);
  void AddText(std::string_view text, const std::string& origin);

  // The first pattern (in load order) that matches `line`.
  std::optional<Match> Find(std::string_view line) const;

  size_t size() const { return patterns_.size(); }

 private:
  struct Pattern;
  std::vector<std::shared_ptr<const Pattern>> patterns_;
};

}  // namespace crucible
