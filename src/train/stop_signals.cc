#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace crucible {
namespace {

volatile sig_atomic_t g_requested = 0;
struct sigaction g_previous_term, g_previous_int, g_previous_usr1, g_previous_xfsz;

void Write(const char* text) {
  ssize_t ignored = write(2, text, std::strlen(text));  // async-signal-safe
  (void)ignored;
}

void OnStopSignal(int signal_number) {
  if (g_requested != 0) {
    if (signal_number == SIGUSR1) return;  // a repeated warning changes nothing
    // Second SIGTERM or SIGINT: die now, by the signal itself (async-signal-safe).
    struct sigaction default_action;
    std::memset(&default_action, 0, sizeof(default_action));
    default_action.sa_handler = SIG_DFL;
    sigaction(signal_number, &default_action, nullptr);
    raise(signal_number);
    return;
  }
  g_requested = signal_number;
  // Tell the operator (and tests) at once.
  Write("crucible: stop requested by ");
  Write(SignalName(signal_number));
  Write(
      ": finishing this step, then a checkpoint and exit 143 (exit 75 if none is written); a "
      "second SIGTERM or SIGINT exits at once\n");
}

// Gives the calling thread an alternate signal stack, once. Never freed (64 KiB a thread): a
// signal may still arrive while the thread or the process ends.
void UseAlternateSignalStack() {
  constexpr size_t kBytes = 1 << 16;
  static thread_local char* alternate = nullptr;
  if (alternate) return;
  alternate = new char[kBytes];
  stack_t stack{};
  stack.ss_sp = alternate;
  stack.ss_size = kBytes;
  sigaltstack(&stack, nullptr);
}

}  // namespace

StopSignals::StopSignals() {
  g_requested = 0;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  // The handler runs on an alternate stack in this thread and in every OpenMP thread (any of
  // them may take a process-directed signal): a signal frame pushed onto the stack of a thread
  // inside oneDNN's sgemm corrupted its heap (glibc: "corrupted size vs. prev_size"), which a
  // flood of SIGUSR1 showed on 1 and 2 threads (tests/integration/test_stop_signals.py).
  UseAlternateSignalStack();
#pragma omp parallel
  UseAlternateSignalStack();
  action.sa_flags = SA_RESTART | SA_ONSTACK;
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGUSR1, &action, &g_previous_usr1);
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &g_previous_xfsz);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
  if (g_requested != 0) {
    // The process is on its way out with 143 or 75: a late copy of the warning (mpirun or srun
    // forwarding what crucible launch also sent directly) must not turn that into a kill.
    struct sigaction ignore;
    std::memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGUSR1, &ignore, nullptr);
  } else {
    sigaction(SIGUSR1, &g_previous_usr1, nullptr);
  }
  sigaction(SIGXFSZ, &g_previous_xfsz, nullptr);
}

int StopSignals::Requested() {
  return g_requested;
}

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal";
  }
}

}  // namespace crucible
