// Subcommand registry. Each cli/<command>.cc registers itself with a static CommandRegistrar:
// the setup function adds the command's options to its CLI11 app and returns the function that
// runs it. main() parses, runs the chosen command, and maps crucible::Error to its exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace crucible {

using CommandRun = std::function<int()>;
using CommandSetup = CommandRun (*)(CLI::App& app);

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* description, CommandSetup setup);
};

}  // namespace crucible
