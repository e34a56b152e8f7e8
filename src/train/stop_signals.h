// SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 (a scheduler's walltime warning, and what `crucible
// launch` sends) ask the training loop to stop: it finishes the current step, writes a
// checkpoint synchronously and exits 143 (75 when it writes none: checkpoint.enable = false). A
// second SIGTERM or SIGINT while that is under way kills the process at once, by that signal,
// leaving no checkpoint that looks complete (saves publish by rename, so a half-written one has
// a temporary name); a repeated SIGUSR1 is ignored, up to the exit. SIGXFSZ is ignored so that
// exceeding a file-size limit surfaces as EFBIG, an I/O error (74). The handler runs on an
// alternate signal stack in the constructing thread and in each OpenMP thread (oneDNN's sgemm did
// not survive a signal frame on its own stack).
#pragma once

namespace crucible {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first stop signal received (SIGTERM, SIGINT or SIGUSR1), or 0.
  static int Requested();
};

const char* SignalName(int signal_number);  // "SIGTERM", "SIGINT", "SIGUSR1", else "signal"

}  // namespace crucible
