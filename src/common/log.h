// Logging to stderr with a level and an optional rank prefix, and the progress-line contract on
// stdout (see docs/architecture.md): "key=value key=value", one line, flushed.
#pragma once

#include <string>

namespace crucible {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void SetLogLevel(LogLevel level);
void SetLogRank(int rank);  // -1: no prefix
void Log(LogLevel level, const std::string& message);
inline void LogInfo(const std::string& message) {
  Log(LogLevel::kInfo, message);
}
inline void LogWarn(const std::string& message) {
  Log(LogLevel::kWarn, message);
}
inline void LogError(const std::string& message) {
  Log(LogLevel::kError, message);
}

// Writes one complete line to stdout and flushes it (progress lines and phase= heartbeats).
// A failed write does not stop the caller: main() turns it into exit 74 when the command ends.
void PrintLine(const std::string& line);
// errno of the first write to stdout that failed (in PrintLine, or reported by a writer that
// bypasses stdio through RecordStdoutError); 0 if none failed.
int PrintLineError();
void RecordStdoutError(int error);

}  // namespace crucible
