#include "common/host_math.h"

#include <atomic>
#include <cmath>

#include "compute/portable/portable_math.h"

namespace crucible {
namespace {
std::atomic<bool> portable_host_math{false};
}  // namespace

void SetPortableHostMath(bool portable) {
  portable_host_math.store(portable, std::memory_order_relaxed);
}
bool PortableHostMath() {
  return portable_host_math.load(std::memory_order_relaxed);
}

double HostLog(double x) {
  return PortableHostMath() ? portable::Log(x) : std::log(x);
}
double HostSin(double x) {
  return PortableHostMath() ? portable::Sin(x) : std::sin(x);
}
double HostCos(double x) {
  return PortableHostMath() ? portable::Cos(x) : std::cos(x);
}
double HostPow(double x, double y) {
  return PortableHostMath() ? portable::Pow(x, y) : std::pow(x, y);
}

}  // namespace crucible
