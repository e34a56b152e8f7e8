#include "train/fault_injector.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "distributed/param_access.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

FaultInjector::FaultInjector(const Config& config, const ParameterTable& table, int rank,
                             bool resumed)
    : rank_(rank),
      corrupt_rank_(config.Int("debug.corrupt_rank")),
      corrupt_step_(config.Int("debug.corrupt_step")),
      nan_step_(config.Int("debug.inject_nan_step")),
      scale_loss_step_(config.Int("debug.scale_loss_step")),
      kill_rank_(resumed ? -1 : config.Int("debug.kill_rank")),
      kill_step_(config.Int("debug.kill_step")),
      loss_divisor_(config.Float("debug.fake_loss_divisor")),
      scale_loss_factor_(config.Float("debug.scale_loss_factor")) {
  if (const char* perturb = std::getenv("CRUCIBLE_TEST_PERTURB_KERNEL"))
    kernels::g_perturb_rmsnorm_for_tests = std::string(perturb) == "rmsnorm";
  if (nan_step_ > 0)
    nan_element_ =
        static_cast<int64_t>(table.Find(config.String("debug.inject_nan_tensor")).offset);
}

void FaultInjector::BeforeStep(int64_t step, TrainingAccess& access) const {
  if (kill_rank_ == rank_ && kill_step_ == step) {
    std::fprintf(stderr,
                 "fault: rank %d kills itself (SIGKILL) before step %lld, as a failed node would "
                 "(debug.kill_rank; a fresh run only)\n",
                 rank_, static_cast<long long>(step));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  if (corrupt_rank_ == rank_ && corrupt_step_ == step) access.CorruptNextGather();
}

int64_t FaultInjector::NanElement(int64_t step, int64_t micro_batch) const {
  return nan_element_ >= 0 && step == nan_step_ && rank_ == 0 && micro_batch == 0 ? nan_element_
                                                                                  : -1;
}

void FaultInjector::AfterUpdate(int64_t step, float* weights, size_t n_params, bool sharded) const {
  if (sharded || corrupt_rank_ != rank_ || corrupt_step_ != step) return;
  uint32_t bits;
  std::memcpy(&bits, &weights[n_params / 2], 4);
  bits ^= 1u << 3;
  std::memcpy(&weights[n_params / 2], &bits, 4);
}

}  // namespace crucible
