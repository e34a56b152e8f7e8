// crucible <command>: one binary for the whole pre-training job (see README.md).
#include <cstdio>
#include <map>
#include <string>

#include "cli/command.h"
#include "common/error.h"
#include "crucible_version.h"

namespace crucible {
namespace {
struct Entry {
  const char* description;
  CommandSetup setup;
};
std::map<std::string, Entry>& Registry() {
  static std::map<std::string, Entry> registry;
  return registry;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* description, CommandSetup setup) {
  Registry()[name] = {description, setup};
}

}  // namespace crucible

int main(int argc, char** argv) {
  using namespace crucible;
  CLI::App app{"Crucible: pre-train language models on clusters where failure is normal.",
               "crucible"};
  app.set_version_flag("--version", std::string("crucible ") + CRUCIBLE_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  std::map<CLI::App*, CommandRun> runs;
  for (auto& [name, entry] : Registry()) {
    CLI::App* sub = app.add_subcommand(name, entry.description);
    runs[sub] = entry.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
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
