// The one error type of Crucible: a message that names the file, key or line at fault, and the
// process exit code the failure maps to. Thrown where the problem is found, caught only in main.
#pragma once

#include <stdexcept>
#include <string>

namespace crucible {

// Exit codes shared by every command (see docs/architecture.md, "Exit codes of the trainer").
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // unexpected failure
  kExitUsage = 2,       // usage or config error: do not retry
  kExitDiverged = 3,    // the loss or the weights went non-finite: do not retry (a resume
                        // replays the same bits); change the config or resume earlier
  kExitBadData = 65,    // bad input data: do not retry
  kExitIo = 74,         // I/O error such as disk full: retry in place
  kExitStoppedNoCheckpoint = 75,  // stopped by a signal, but no complete checkpoint of the
                                  // step it stopped at exists: resume from an earlier one
  kExitTimeout = 124,   // the launcher's watchdog killed a silent job
  kExitSignalled = 143  // stopped by SIGTERM after writing a checkpoint
};

class Error : public std::runtime_error {
 public:
  Error(int exit_code, const std::string& message)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

inline Error UsageError(const std::string& message) {
  return Error(kExitUsage, message);
}
inline Error DataError(const std::string& message) {
  return Error(kExitBadData, message);
}
inline Error IoError(const std::string& message) {
  return Error(kExitIo, message);
}

// Throws IoError with strerror(errno) appended: "<what>: <strerror>".
[[noreturn]] void ThrowErrno(const std::string& what);

}  // namespace crucible
