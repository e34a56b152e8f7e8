#include "train/mfu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/log.h"
#include "common/profile.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {

namespace {
constexpr char kRemeasureHint[] =
    "--set metrics.remeasure_peak=true measures it again (the cache keeps the higher value)";
}  // namespace

PeakFlops ResolvePeakFlops(const Config& config, Communicator& comm,
                           const std::vector<GemmShape>& shapes, ComputeBackend& backend) {
  const double configured = config.Float("metrics.peak_gflops");
  if (configured > 0) return {configured * comm.size(), "config"};
  if (!backend.host_memory()) {
    const double mine = MeasureBackendGemmCeiling(backend, shapes);
    std::vector<double> all(comm.size());
    comm.AllGatherDouble(&mine, all.data(), 1, "peak-flops all-gather");
    double total = 0;
    for (double g : all) total += g;
    return {total, "device"};
  }
  const std::vector<std::string> hosts = comm.AllGatherString(comm.host(), "peak-flops hosts");
  const int ranks_on_host = static_cast<int>(std::count(hosts.begin(), hosts.end(), comm.host()));
  // bf16: the backend's own products (gemm_ceiling.h), fp32: the best library's.
  ComputeBackend* own = backend.compute() == ComputePrecision::kFloat32 ? nullptr : &backend;
  const std::string key = GemmCeilingKey(ranks_on_host, shapes, own), path = GemmCeilingCachePath();
  double mine[2] = {LookupGemmCeiling(path, key), 1.0};  // the ceiling, and whether cached
  const bool again = config.Bool("metrics.remeasure_peak");
  if (!(mine[0] > 0) || again) {
    if (comm.rank() == 0)
      PrintLine(StrFormat("phase=peak_flops status=measuring shapes=%zu cache=%s%s", shapes.size(),
                          path.c_str(),
                          mine[0] > 0 ? StrFormat(" cached_gflops=%.4g", mine[0]).c_str() : ""));
    mine[0] = MeasureAndCacheGemmCeiling(shapes, path, key, own);
    mine[1] = 0.0;
  }
  std::vector<double> all(2 * comm.size());
  comm.AllGatherDouble(mine, all.data(), 2, "peak-flops all-gather");
  double total = 0;
  bool cached = true;
  for (int r = 0; r < comm.size(); ++r) {
    total += all[2 * r];
    cached = cached && all[2 * r + 1] > 0;
  }
  return {total, cached ? "cached" : "measured"};
}

void MfuMeter::CheckProfiledKernels(int ranks) const {
  const double ceiling = peak_.gflops / ranks;  // per rank, as the profile's rates are
  std::string fastest;
  double fastest_gflops = 0;
  int above = 0;
  for (const KernelTotals& t : KernelProfileTotals()) {
    const double gflops = t.seconds > 0 ? t.flops / t.seconds / 1e9 : 0;
    if (!(gflops > ceiling)) continue;
    ++above;
    if (gflops > fastest_gflops) {
      fastest = t.name;
      fastest_gflops = gflops;
    }
  }
  if (above == 0) return;
  LogWarn(StrFormat(
      "metrics.profile: %s ran at %.4g GFLOP/s%s, above the GEMM ceiling of %.4g GFLOP/s per "
      "rank (peak_source=%s): %s; every MFU of this run reads too high: %s",
      fastest.c_str(), fastest_gflops,
      above > 1 ? StrFormat(" (and %d more kernels above it)", above - 1).c_str() : "", ceiling,
      peak_.source.c_str(),
      peak_.source == "config" ? "metrics.peak_gflops is too low"
                               : "it was measured while the machine was slower",
      peak_.source == "config" ? "raise metrics.peak_gflops" : kRemeasureHint));
}

double MfuMeter::Percent(double tokens_per_second, int64_t step) {
  const double achieved_gflops = tokens_per_second * flops_per_token_ / 1e9;
  if (!peak_exceeded_ && achieved_gflops > peak_.gflops) {
    peak_exceeded_ = true;
    LogWarn(
        StrFormat("step %lld: this step achieved %.4g GFLOP/s, more than the peak of %.4g GFLOP/s "
                  "(peak_source=%s%s); MFU is not reported from here on (mfu=nan): %sset "
                  "metrics.peak_gflops to the per-rank peak of this machine",
                  (long long)step, achieved_gflops, peak_.gflops, peak_.source.c_str(),
                  peak_.source == "config" ? "" : ", measured while the machine was busy?",
                  peak_.source == "config" ? "" : (std::string(kRemeasureHint) + ", or ").c_str()));
  }
  if (peak_exceeded_) return std::nan("");
  return 100.0 * achieved_gflops / peak_.gflops;
}

}  // namespace crucible
