// SIGTERM and SIGUSR1 (a scheduler's walltime warning) ask the training loop to stop: it
// finishes the current step, writes a checkpoint synchronously and exits 143. A second SIGTERM
// while that is under way kills the process at once (default action), leaving no checkpoint
// that looks complete (saves publish by rename, so a half-written one has a temporary name).
// SIGXFSZ is ignored so that exceeding a file-size limit surfaces as EFBIG, an I/O error (74).
#pragma once

namespace crucible {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first stop signal received (SIGTERM or SIGUSR1), or 0.
  static int Requested();
};

const char* SignalName(int signal_number);

}  // namespace crucible
