// crucible <command>: one binary for the whole pre-training job (see README.md).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "cli/command.h"
#include "common/error.h"
#include "common/log.h"
#include "common/registry.h"
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
