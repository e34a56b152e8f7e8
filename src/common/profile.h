// A per-kernel wall-clock profile: when enabled ([metrics] profile = true), each kernel entry
// point adds its time under its name; the trainer prints the totals at the end of a run.
// Disabled, a timer costs one predictable branch.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace crucible {

void EnableKernelProfile(bool enabled);
bool KernelProfileEnabled();
void AddKernelTime(const char* name, double seconds);
// (name, seconds) sorted by time, largest first.
std::vector<std::pair<std::string, double>> KernelProfileTotals();
// Prints one `phase=profile kernel=<name> seconds=<s> share=<percent>` line per entry.
void PrintKernelProfile();

class ScopedKernelTimer {
 public:
  explicit ScopedKernelTimer(const char* name);
  ~ScopedKernelTimer();

 private:
  const char* name_;
  double start_;
};

}  // namespace crucible
