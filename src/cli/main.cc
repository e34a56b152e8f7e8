// crucible <command>: one binary for the whole pre-training job (see README.md).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/error.h"
#include "common/log.h"
#include "common/registry.h"
#include "common/strings.h"
#include "crucible_version.h"

namespace crucible {
namespace {
struct Entry {
  const char* description;
  CommandSetup setup;
};
Registry<Entry>& Commands() {
  static Registry<Entry> registry("command");
  return registry;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* description, CommandSetup setup) {
  Commands().Add(name, {description, setup});
}

}  // namespace crucible

namespace {

int help_errno = 0;  // errno right after CLI11 printed help or the version, if that failed

int NoteHelpOutput(int exit_code) {
  if (std::ferror(stdout) && help_errno == 0) help_errno = errno;
  return exit_code;
}

// What a command printed must have reached stdout: a full disk, a closed stdout or any other
// failed write turns exit 0 into exit 74 with a one-line error, never exit 0 with output lost.
// (A command that failed already keeps its own code and message.)
int CheckStdout(int exit_code) {
  using namespace crucible;
  const bool earlier = std::ferror(stdout) != 0 || PrintLineError() != 0;
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !earlier) return exit_code;
  if (exit_code != kExitOk) return exit_code;
  const int error = !flushed && errno ? errno : help_errno ? help_errno : PrintLineError();
  std::fprintf(stderr, "crucible: error: cannot write to stdout: %s\n",
               error ? std::strerror(error) : "a write failed");
  return kExitIo;
}

// The listed subcommands of `app` (a hidden one, like launch-rank, is in no group).
std::vector<const CLI::App*> ListedSubcommands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* sub) { return !sub->get_group().empty(); });
}

// The words of argv that name commands must name registered ones: at every level that has
// subcommands (crucible, crucible data, ...), the first word that is neither an option nor an
// option's value is a subcommand. An unknown one is a UsageError naming it and the closest valid
// one, checked before CLI11 parses, which would print the help and exit 0 for
// `crucible nosuchcmd --help`.
void CheckCommandNames(const CLI::App& app, int argc, char** argv) {
  const CLI::App* current = &app;
  std::string path = current->get_name();
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return;
    if (word.size() > 1 && word[0] == '-') {
      // An option that takes a value takes the next word too, unless it came as --name=value.
      const std::string name = word.substr(0, word.find('='));
      const CLI::Option* option = current->get_option_no_throw(name);
      if (option && option->get_items_expected_max() > 0 && name.size() == word.size()) ++i;
      continue;
    }
    const std::vector<const CLI::App*> subcommands = current->get_subcommands({});
    if (subcommands.empty()) return;  // a leaf: its positionals are its own
    const auto named = std::find_if(subcommands.begin(), subcommands.end(),
                                    [&](const CLI::App* sub) { return sub->check_name(word); });
    if (named != subcommands.end()) {
      current = *named;
      path += " " + word;
      continue;
    }
    std::string closest;
    size_t closest_distance = std::string::npos;
    for (const CLI::App* sub : ListedSubcommands(*current)) {
      const size_t distance = crucible::EditDistance(word, sub->get_name());
      if (distance < closest_distance) {
        closest_distance = distance;
        closest = sub->get_name();
      }
    }
    throw crucible::UsageError(path + ": unknown command '" + word + "'" +
                               (closest.empty() ? "" : " (did you mean '" + closest + "'?)") +
                               "; see " + path + " --help");
  }
}

int Run(int argc, char** argv) {
  using namespace crucible;
  CLI::App app{"Crucible: pre-train language models on clusters where failure is normal.",
               "crucible"};
  app.set_version_flag("--version", std::string("crucible ") + CRUCIBLE_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  std::map<CLI::App*, CommandRun> runs;
  for (const auto& [name, entry] : Commands().entries()) {
    CLI::App* sub = app.add_subcommand(name, entry.description);
    runs[sub] = entry.setup(*sub);
  }
  try {
    CheckCommandNames(app, argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "crucible: error: %s\n", e.what());
    return e.exit_code();
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return NoteHelpOutput(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return NoteHelpOutput(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return NoteHelpOutput(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "crucible: error: %s (see crucible --help)\n", e.what());
    return kExitUsage;
  }
  try {
    for (auto& [sub, run] : runs) {
      if (sub->parsed() && run) return run();
    }
    return kExitUsage;
  } catch (const Error& e) {
    std::fprintf(stderr, "crucible: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "crucible: error: out of memory\n");
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crucible: error: unexpected failure: %s\n", e.what());
    return kExitFailure;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return CheckStdout(Run(argc, argv));
}
