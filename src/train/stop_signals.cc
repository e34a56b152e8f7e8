#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace crucible {
namespace {

volatile sig_atomic_t g_requested = 0;
struct sigaction g_previous_term, g_previous_usr1, g_previous_xfsz;

void OnStopSignal(int signal_number) {
  if (g_requested != 0 && signal_number == SIGTERM) {
    // Second SIGTERM: die now, by the signal itself (async-signal-safe).
    struct sigaction default_action;
    std::memset(&default_action, 0, sizeof(default_action));
    default_action.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &default_action, nullptr);
    raise(SIGTERM);
    return;
  }
  if (g_requested == 0) {
    g_requested = signal_number;
    // Tell the operator (and tests) at once; write(2) is async-signal-safe.
    static const char kMessage[] =
        "crucible: stop requested: finishing this step, then a checkpoint and exit 143 (a second "
        "SIGTERM exits at once)\n";
    ssize_t ignored = write(2, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
  }
}

}  // namespace

StopSignals::StopSignals() {
  g_requested = 0;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGUSR1, &action, &g_previous_usr1);
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &g_previous_xfsz);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGUSR1, &g_previous_usr1, nullptr);
  sigaction(SIGXFSZ, &g_previous_xfsz, nullptr);
}

int StopSignals::Requested() {
  return g_requested;
}

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal";
  }
}

}  // namespace crucible
