#include "common/profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "common/log.h"
#include "common/strings.h"

namespace crucible {
namespace {
bool g_enabled = false;
std::mutex g_mutex;
std::map<std::string, double>& Totals() {
  static std::map<std::string, double> totals;
  return totals;
}
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void EnableKernelProfile(bool enabled) {
  g_enabled = enabled;
}
bool KernelProfileEnabled() {
  return g_enabled;
}

void AddKernelTime(const char* name, double seconds) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Totals()[name] += seconds;
}

std::vector<std::pair<std::string, double>> KernelProfileTotals() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::pair<std::string, double>> out(Totals().begin(), Totals().end());
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

void PrintKernelProfile() {
  auto totals = KernelProfileTotals();
  double sum = 0;
  for (const auto& [name, seconds] : totals) sum += seconds;
  for (const auto& [name, seconds] : totals)
    PrintLine(StrFormat("phase=profile kernel=%s seconds=%.3f share=%.1f", name.c_str(), seconds,
                        sum > 0 ? 100.0 * seconds / sum : 0.0));
}

ScopedKernelTimer::ScopedKernelTimer(const char* name)
    : name_(name), start_(g_enabled ? Now() : 0.0) {}

ScopedKernelTimer::~ScopedKernelTimer() {
  if (g_enabled) AddKernelTime(name_, Now() - start_);
}

}  // namespace crucible
