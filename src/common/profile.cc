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
std::map<std::string, KernelTotals>& Totals() {
  static std::map<std::string, KernelTotals> totals;
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

void AddKernelTime(const char* name, double seconds, double flops, double bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  KernelTotals& t = Totals()[name];
  t.name = name;
  t.seconds += seconds;
  t.flops += flops;
  t.bytes += bytes;
  ++t.calls;
}

std::vector<KernelTotals> KernelProfileTotals() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<KernelTotals> out;
  for (const auto& [name, totals] : Totals()) out.push_back(totals);
  std::sort(out.begin(), out.end(),
            [](const KernelTotals& a, const KernelTotals& b) { return a.seconds > b.seconds; });
  return out;
}

void PrintKernelProfile(double ceiling_gflops) {
  const std::vector<KernelTotals> totals = KernelProfileTotals();
  double sum = 0;
  for (const KernelTotals& t : totals) sum += t.seconds;
  for (const KernelTotals& t : totals) {
    std::string line =
        StrFormat("phase=profile kernel=%s seconds=%.3f share=%.1f calls=%lld", t.name.c_str(),
                  t.seconds, sum > 0 ? 100.0 * t.seconds / sum : 0.0, (long long)t.calls);
    if (t.flops > 0 && t.seconds > 0) {
      const double gflops = t.flops / t.seconds / 1e9;
      line += StrFormat(" gflop=%.2f gflops=%.1f", t.flops / 1e9, gflops);
      if (ceiling_gflops > 0)
        line += StrFormat(" of_ceiling=%.1f", 100.0 * gflops / ceiling_gflops);
    }
    if (t.bytes > 0 && t.seconds > 0)
      line += StrFormat(" gbytes=%.2f gbytes_per_s=%.1f", t.bytes / 1e9, t.bytes / t.seconds / 1e9);
    PrintLine(line);
  }
}

ScopedKernelTimer::ScopedKernelTimer(const char* name, double flops, double bytes)
    : name_(name), start_(g_enabled ? Now() : 0.0), flops_(flops), bytes_(bytes) {}

ScopedKernelTimer::~ScopedKernelTimer() {
  if (g_enabled) AddKernelTime(name_, Now() - start_, flops_, bytes_);
}

}  // namespace crucible
