// MFU, model FLOPs utilisation: the training FLOP/s achieved (tokens/s x FLOPs per token) as a
// percentage of the peak FLOP/s of the job's machines. The peak comes from the config
// ([metrics] peak_gflops, per rank) or is the machine's GEMM ceiling for the model's shapes (fp32,
// or in bf16 compute the backend's own bf16 products), measured once and cached
// (train/gemm_ceiling.h; metrics.remeasure_peak measures it again, keeping the higher). A peak
// below an achieved rate is known to be wrong (a machine busy while it was measured): from then on
// no MFU is reported.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "distributed/communicator.h"
#include "train/gemm_ceiling.h"

namespace crucible {

struct PeakFlops {
  double gflops = 0;  // of the whole job
  // "config", "cached" (every rank's), "measured" (some rank measured) or "device" (measured on
  // each rank's device)
  std::string source;
};

// Collective: metrics.peak_gflops x ranks, or the sum of every rank's GEMM ceiling for `shapes`
// (train/gemm_ceiling.h: on the host, cached, or measured by the ranks that lack it, at the same
// time, so the shares of a shared host add up; on a device, measured through `backend` at every
// start, source "device").
PeakFlops ResolvePeakFlops(const Config& config, Communicator& comm,
                           const std::vector<GemmShape>& shapes, ComputeBackend& backend);

class MfuMeter {
 public:
  MfuMeter(PeakFlops peak, double flops_per_token)
      : peak_(peak), flops_per_token_(flops_per_token) {}

  // MFU in percent of the step that ran at `tokens_per_second`; NaN once a step has run faster
  // than the peak allows (warns once, at that step, suggesting metrics.peak_gflops).
  double Percent(double tokens_per_second, int64_t step);
  double peak_gflops() const { return peak_.gflops; }  // of the whole job
  // With metrics.profile: warns when a profiled kernel ran faster than the ceiling per rank (the
  // whole job's over `ranks`). A step can sit below a stale ceiling (the products are 85% of it)
  // while its products run above it; that shows a ceiling cached too low where the step cannot.
  void CheckProfiledKernels(int ranks) const;

 private:
  PeakFlops peak_;
  double flops_per_token_;
  bool peak_exceeded_ = false;
};

}  // namespace crucible
