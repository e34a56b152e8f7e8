// crucible top RUN: a live terminal view of a running job, read from its run directory alone
// (report/top.h); --once prints one plain-text frame instead.
#include "report/top.h"

#include <langinfo.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <clocale>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

// Last: curses.h defines macros (erase, refresh, timeout, ...) that other headers must not see.
#include <curses.h>

namespace crucible {
namespace {

struct TopCliOptions {
  std::string run_dir;
  double interval = 1;
  double stall_seconds = 0;
  int width = 0;
  bool once = false;
};

volatile std::sig_atomic_t quit_signal = 0;
void OnQuitSignal(int signal) {
  quit_signal = signal;
}

// Stop signals end the view cleanly (endwin) instead of leaving the terminal in curses mode. No
// SA_RESTART: the wait for a key returns at once.
void InstallQuitHandlers() {
  struct sigaction action {};
  action.sa_handler = OnQuitSignal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
}

int TerminalColumns() {
  struct winsize size {};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0)
    return size.ws_col;
  return 80;
}

bool Utf8Locale() {
  std::setlocale(LC_ALL, "");
  return std::strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
}

int PrintOnce(const TopCliOptions& o) {
  if (!IsDirectory(o.run_dir)) {
    const std::string failure = StatFailure(o.run_dir);
    throw UsageError("top: " + o.run_dir + ": no such run directory (" +
                     (failure.empty() ? std::string("not a directory") : failure) + ")");
  }
  TopWatcher watcher(o.run_dir);
  const TopSnapshot snapshot = watcher.Poll(WallSeconds());
  if (!snapshot.metrics_exist)
    throw Error(kExitFailure, "top: " + JoinPath(o.run_dir, "metrics.jsonl") +
                                  " does not exist yet (the run has logged no step, or "
                                  "[metrics] enable_jsonl is false)");
  TopFrameOptions frame;
  frame.width = size_t(o.width > 0 ? o.width : TerminalColumns());
  frame.unicode = Utf8Locale();
  frame.stall_seconds = o.stall_seconds;
  for (const TopLine& line : ComposeTopFrame(snapshot, frame))
    std::printf("%s\n", line.text.c_str());
  return kExitOk;
}

// Ends curses mode however the view ends.
struct Screen {
  SCREEN* screen = nullptr;
  Screen() {
    screen = newterm(nullptr, stdout, stdin);
    if (!screen)
      throw UsageError("top: cannot start the terminal view (TERM=" +
                       std::string(std::getenv("TERM") ? std::getenv("TERM") : "") +
                       "); use --once for plain text");
  }
  ~Screen() {
    endwin();
    delscreen(screen);
  }
};

int RunLive(const TopCliOptions& o) {
  if (!::isatty(STDIN_FILENO) || !::isatty(STDOUT_FILENO))
    throw UsageError("top: the live view needs a terminal; use --once for plain text");
  const bool unicode = Utf8Locale();
  InstallQuitHandlers();
  Screen screen;
  cbreak();
  noecho();
  curs_set(0);
  keypad(stdscr, TRUE);
  bool colors = false;
  if (has_colors()) {
    start_color();
    use_default_colors();
    colors = init_pair(1, COLOR_WHITE, COLOR_RED) == OK;
  }
  TopWatcher watcher(o.run_dir);
  while (quit_signal == 0) {
    const double now = WallSeconds();
    std::vector<TopLine> lines;
    TopFrameOptions frame;
    frame.width = size_t(std::max(COLS, 1));
    frame.unicode = unicode;
    frame.stall_seconds = o.stall_seconds;
    try {
      lines = ComposeTopFrame(watcher.Poll(now), frame);
    } catch (const Error& e) {  // a shared filesystem hiccup: show it and keep refreshing
      lines = {{"crucible top  " + o.run_dir, false}, {std::string("error: ") + e.what(), true}};
    }
    const std::time_t seconds = std::time_t(now);
    char clock[16] = "";
    std::tm local{};
    if (localtime_r(&seconds, &local)) std::strftime(clock, sizeof clock, "%H:%M:%S", &local);
    erase();
    int row = 0;
    for (const TopLine& line : lines) {
      if (row >= LINES - 1) break;
      const attr_t attributes = line.alert ? (A_BOLD | (colors ? COLOR_PAIR(1) : A_REVERSE)) : 0;
      if (attributes) attron(attributes);
      mvaddnstr(row++, 0, line.text.c_str(), -1);
      if (attributes) attroff(attributes);
    }
    const std::string footer = StrFormat("q: quit   refresh every %g s   %s", o.interval, clock);
    mvaddnstr(LINES - 1, 0, footer.c_str(), std::max(COLS - 1, 0));
    refresh();

    // Wait out the interval, answering keys: q quits, a resize redraws at once.
    const double deadline = now + o.interval;
    while (quit_signal == 0) {
      const double left = deadline - WallSeconds();
      if (left <= 0) break;
      timeout(std::max(1, int(left * 1000)));
      const int key = getch();
      if (key == 'q' || key == 'Q' || key == 3 /* Ctrl-C without a signal */) return kExitOk;
      if (key == KEY_RESIZE) break;
    }
  }
  return kExitOk;
}

CommandRun SetupTop(CLI::App& app) {
  auto o = std::make_shared<TopCliOptions>();
  app.add_option("RUN", o->run_dir, "run directory (job.dump_folder) of a running or finished job")
      ->required();
  app.add_option("--interval", o->interval, "seconds between refreshes (fractions allowed)")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  app.add_flag("--once", o->once,
               "print one plain-text frame to stdout and exit (no curses): exit 2 when RUN is "
               "not a directory, 1 when it has no metrics.jsonl yet");
  app.add_option("--stall-seconds", o->stall_seconds,
                 "seconds without a step line that count as stalled (default: 3 x the recent "
                 "step time, at least 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--width", o->width,
                 "--once: columns of the frame (default: the terminal's, else 80)")
      ->check(CLI::Range(20, 1000));
  app.footer(
      "Shows the run name, last step / training.steps, the loss and a sparkline of the recent "
      "steps, tokens/s, the ETA (the mean of the last 20 step times), the newest checkpoint and "
      "its age, the launcher's attempt (launch/), for how long no step line was written (shown "
      "highlighted past the stall threshold) and whether the job looks finished. It reads only "
      "the run directory, so it works over a shared filesystem. Keys: q quits; the view redraws "
      "when the terminal is resized.");
  return [o]() { return o->once ? PrintOnce(*o) : RunLive(*o); };
}

CommandRegistrar top_registrar(
    "top", "live terminal view of a running job from its run directory (step, loss, ETA, stalls)",
    SetupTop);

}  // namespace
}  // namespace crucible
