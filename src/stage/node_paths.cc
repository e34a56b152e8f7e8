#include "stage/node_paths.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>

#include "common/files.h"
#include "common/strings.h"
#include "launch/hostlist.h"

namespace crucible {
namespace {

constexpr const char* kArchiveExtensions[] = {".tar.gz", ".tar.zst", ".tgz", ".tar"};

std::string Absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  return getcwd(cwd, sizeof(cwd)) ? JoinPath(cwd, path) : path;
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// `argument` pointed at the staged copy, or "" when it names none of the sources.
std::string Rewrite(const std::string& argument, const std::vector<std::string>& sources,
                    const std::string& destination) {
  for (const std::string& given : sources) {
    const std::string staged = JoinPath(destination, StagedName(given));
    for (const std::string& source :
         {StripTrailingSlashes(given), Absolute(StripTrailingSlashes(given))}) {
      if (argument == source) return staged;
      if (StartsWith(argument, source + "/")) return staged + argument.substr(source.size());
    }
  }
  return "";
}

}  // namespace

std::string ArchiveStem(const std::string& name) {
  for (const char* extension : kArchiveExtensions)
    if (EndsWith(name, extension) && name.size() > std::string_view(extension).size())
      return name.substr(0, name.size() - std::string_view(extension).size());
  return name;
}

std::string SbcastStagingPath(const std::string& destination, const std::string& yeet_id) {
  const std::string parent = ParentDirectory(StripTrailingSlashes(destination));
  const std::string folder =
      parent.empty() || parent.find('%') != std::string::npos ? "/tmp" : parent;
  return JoinPath(folder, ".crucible-yeet-" + yeet_id + ".sbcast");
}

std::string StagedName(const std::string& source) {
  const std::string path = StripTrailingSlashes(source);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> RewriteArguments(const std::vector<std::string>& arguments,
                                          const std::vector<std::string>& sources,
                                          const std::string& destination) {
  std::vector<std::string> out;
  for (const std::string& argument : arguments) {
    std::string rewritten = Rewrite(argument, sources, destination);
    const size_t equals = argument.find('=');
    if (rewritten.empty() && equals != std::string::npos) {
      rewritten = Rewrite(argument.substr(equals + 1), sources, destination);
      if (!rewritten.empty()) rewritten = argument.substr(0, equals + 1) + rewritten;
    }
    out.push_back(rewritten.empty() ? argument : rewritten);
  }
  return out;
}

}  // namespace crucible
