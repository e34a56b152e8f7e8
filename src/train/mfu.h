// MFU, model FLOPs utilisation: the training FLOP/s achieved (tokens/s x FLOPs per token) as a
// percentage of the peak FLOP/s of the job's machines. The peak comes from the config
// ([metrics] peak_gflops, per rank) or is measured at start. A peak below an achieved rate is
// known to be wrong (a machine busy while it was measured): from then on no MFU is reported.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "distributed/communicator.h"

namespace crucible {

struct PeakFlops {
  double gflops = 0;   // of the whole job
  std::string source;  // "config" or "measured"
};

// Peak fp32 GFLOP/s of this process, measured as the best of several 1024^3 sgemm runs on all
// OpenMP threads (at least 5, at most 20, about half a second).
double MeasurePeakGflops();

// Collective: metrics.peak_gflops x ranks, or every rank measures its share of the machine at
// the same time and the shares add up.
PeakFlops ResolvePeakFlops(const Config& config, Communicator& comm);

class MfuMeter {
 public:
  MfuMeter(PeakFlops peak, double flops_per_token)
      : peak_(peak), flops_per_token_(flops_per_token) {}

  // MFU in percent of the step that ran at `tokens_per_second`; NaN once a step has run faster
  // than the peak allows (warns once, at that step, suggesting metrics.peak_gflops).
  double Percent(double tokens_per_second, int64_t step);

 private:
  PeakFlops peak_;
  double flops_per_token_;
  bool peak_exceeded_ = false;
};

}  // namespace crucible
