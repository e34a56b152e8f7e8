#include "train/mfu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {

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
  if (!(mine[0] > 0)) {
    if (comm.rank() == 0)
      PrintLine(StrFormat("phase=peak_flops status=measuring shapes=%zu cache=%s", shapes.size(),
                          path.c_str()));
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

double MfuMeter::Percent(double tokens_per_second, int64_t step) {
  const double achieved_gflops = tokens_per_second * flops_per_token_ / 1e9;
  if (!peak_exceeded_ && achieved_gflops > peak_.gflops) {
    peak_exceeded_ = true;
    LogWarn(StrFormat(
        "step %lld: this step achieved %.4g GFLOP/s, more than the peak of %.4g GFLOP/s "
        "(peak_source=%s%s); MFU is not reported from here on (mfu=nan): %sset "
        "metrics.peak_gflops to the per-rank peak of this machine",
        (long long)step, achieved_gflops, peak_.gflops, peak_.source.c_str(),
        peak_.source == "config" ? "" : ", measured while the machine was busy?",
        peak_.source == "config"
            ? ""
            : ("delete " + GemmCeilingCachePath() + " to measure it again, or ").c_str()));
  }
  if (peak_exceeded_) return std::nan("");
  return 100.0 * achieved_gflops / peak_.gflops;
}

}  // namespace crucible
