// A per-kernel wall-clock profile: when enabled ([metrics] profile = true), each kernel entry
// point adds its time under its name, with the floating-point operations it did and the bytes it
// had to move at least (each operand read once, each result written once: a lower bound on the
// memory traffic, so bytes / seconds is a lower bound on the bandwidth it used); the trainer
// prints the totals at the end of a run. Disabled, a timer costs one predictable branch.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace crucible {

void EnableKernelProfile(bool enabled);
bool KernelProfileEnabled();
void AddKernelTime(const char* name, double seconds, double flops = 0, double bytes = 0);

struct KernelTotals {
  std::string name;
  double seconds = 0, flops = 0, bytes = 0;
  int64_t calls = 0;
};
// Every kernel's totals, sorted by time, largest first.
std::vector<KernelTotals> KernelProfileTotals();
// Prints one line per kernel: `phase=profile kernel=<name> seconds=<s> share=<percent of the
// summed kernel time> calls=<n> gflop=<total> gflops=<achieved> gbytes_per_s=<at least>
// of_ceiling=<percent of ceiling_gflops>` (the last three only where known: flops, bytes, a
// ceiling > 0).
void PrintKernelProfile(double ceiling_gflops = 0);

// A kernel's name in the table, its flops and its bytes at least (kernels/kernel_costs.h).
struct KernelCost {
  const char* name;
  double flops = 0, bytes = 0;
};

class ScopedKernelTimer {
 public:
  explicit ScopedKernelTimer(const char* name, double flops = 0, double bytes = 0);
  explicit ScopedKernelTimer(const KernelCost& cost)
      : ScopedKernelTimer(cost.name, cost.flops, cost.bytes) {}
  ~ScopedKernelTimer();

 private:
  const char* name_;
  double start_, flops_, bytes_;
};

}  // namespace crucible
