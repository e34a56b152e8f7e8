#include "common/log.h"

#include <cerrno>
#include <cstdio>
#include <mutex>

namespace crucible {
namespace {
LogLevel g_level = LogLevel::kInfo;
int g_rank = -1;
std::mutex g_mutex;
int g_print_error = 0;  // guarded by g_mutex
}  // namespace

void SetLogLevel(LogLevel level) {
  g_level = level;
}
void SetLogRank(int rank) {
  g_rank = rank;
}

void Log(LogLevel level, const std::string& message) {
  if (level < g_level) return;
  const char* tag = level == LogLevel::kDebug  ? "debug"
                    : level == LogLevel::kInfo ? "info"
                    : level == LogLevel::kWarn ? "warning"
                                               : "error";
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_rank >= 0) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", g_rank, tag, message.c_str());
  } else {
    std::fprintf(stderr, "%s: %s\n", tag, message.c_str());
  }
  std::fflush(stderr);
}

void PrintLine(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  errno = 0;
  const bool written = std::fwrite(line.data(), 1, line.size(), stdout) == line.size() &&
                       std::fputc('\n', stdout) != EOF && std::fflush(stdout) == 0;
  if (!written && g_print_error == 0) g_print_error = errno ? errno : EIO;
}

void RecordStdoutError(int error) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_print_error == 0) g_print_error = error ? error : EIO;
}

int PrintLineError() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_print_error;
}

}  // namespace crucible
