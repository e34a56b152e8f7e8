#include "train/mfu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {

double MeasurePeakGflops() {
  const int n = 1024;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int i = 0; i < n * n; ++i) a[i] = b[i] = static_cast<float>(i % 7) * 0.1f;
  // The best run counts: on a machine that other work slows down, more runs give a quiet
  // moment more chances to show.
  double best = 0;
  Timer total;
  for (int repeat = 0; repeat < 20 && (repeat < 5 || total.Seconds() < 0.5); ++repeat) {
    Timer t;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / t.Seconds() / 1e9);
  }
  return best;
}

PeakFlops ResolvePeakFlops(const Config& config, Communicator& comm) {
  const double configured = config.Float("metrics.peak_gflops");
  if (configured > 0) return {configured * comm.size(), "config"};
  if (comm.rank() == 0) PrintLine("phase=peak_flops status=measuring");
  const double mine = MeasurePeakGflops();
  std::vector<double> all(comm.size());
  comm.AllGatherDouble(&mine, all.data(), 1, "peak-flops all-gather");
  double total = 0;
  for (double p : all) total += p;
  return {total, "measured"};
}

double MfuMeter::Percent(double tokens_per_second, int64_t step) {
  const double achieved_gflops = tokens_per_second * flops_per_token_ / 1e9;
  if (!peak_exceeded_ && achieved_gflops > peak_.gflops) {
    peak_exceeded_ = true;
    LogWarn(
        StrFormat("step %lld: this step achieved %.4g GFLOP/s, more than the peak of %.4g GFLOP/s "
                  "(peak_source=%s%s); MFU is not reported from here on (mfu=nan): set "
                  "metrics.peak_gflops to the per-rank peak of this machine",
                  (long long)step, achieved_gflops, peak_.gflops, peak_.source.c_str(),
                  peak_.source == "measured" ? ", measured while the machine was busy?" : ""));
  }
  if (peak_exceeded_) return std::nan("");
  return 100.0 * achieved_gflops / peak_.gflops;
}

}  // namespace crucible
