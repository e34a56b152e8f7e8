// The faults tests inject into a training run, all behind one object: the [debug] keys marked
// "test only" in `crucible config keys`, and CRUCIBLE_TEST_PERTURB_KERNEL. A run that sets none
// of them (every real run) gets an injector that does nothing; the trainer asks it at fixed
// points of the step and needs no test-only branch of its own.
//   debug.corrupt_rank / corrupt_step   that rank flips one bit of its parameters at that step:
//                                       its replica (ZeRO 0/1), or the next unit it gathers
//                                       (ZeRO-3), as a faulty node would
//   debug.inject_nan_step / _tensor     rank 0's first micro-batch of that step gets a NaN
//                                       gradient in the first element of that tensor
//   debug.fake_loss_divisor             the logged loss is divided by it (a wrong logging fix)
//   debug.scale_loss_step / _factor     the loss of that step, as logged and as the step guards
//                                       see it, is multiplied by the factor (a synthetic spike;
//                                       the gradients are untouched)
//   debug.kill_rank / kill_step         that rank SIGKILLs itself before that step, as a node that
//                                       dies does; only in a run that started fresh, never in a
//                                       resumed one (make demo's recovery, the launcher's tests)
//   CRUCIBLE_TEST_PERTURB_KERNEL=rmsnorm  every RMSNorm output moves by one ULP (the smoke gate
//                                       must notice)
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.h"
#include "model/parameters.h"

namespace crucible {

class TrainingAccess;

class FaultInjector {
 public:
  // For rank `rank` of the run; `table` names the tensor of debug.inject_nan_tensor (UsageError
  // when it has none of that name). Applies CRUCIBLE_TEST_PERTURB_KERNEL. `resumed`: the run
  // resumed from a checkpoint (debug.kill_rank then does nothing).
  FaultInjector(const Config& config, const ParameterTable& table, int rank, bool resumed);

  // Before step `step`'s forward pass: the rank of debug.kill_rank dies at its step; the next
  // unit `access` gathers is corrupted (ZeRO-3; a layout that gathers nothing ignores it and gets
  // the bit flip in AfterUpdate).
  void BeforeStep(int64_t step, TrainingAccess& access) const;
  // The flat element whose gradient becomes NaN in micro-batch `micro_batch` of `step` on this
  // rank, or -1.
  int64_t NanElement(int64_t step, int64_t micro_batch) const;
  // The loss of `step` as it is logged (and as the step guards see it).
  double LoggedLoss(double loss, int64_t step) const {
    return (step == scale_loss_step_ ? loss * scale_loss_factor_ : loss) / loss_divisor_;
  }
  // After the update of `step`: a replicated run (weights holds all n_params) gets the bit flip.
  void AfterUpdate(int64_t step, float* weights, size_t n_params, bool sharded) const;

 private:
  int rank_;
  int64_t corrupt_rank_, corrupt_step_, nan_step_, scale_loss_step_, kill_rank_, kill_step_;
  int64_t nan_element_ = -1;
  double loss_divisor_, scale_loss_factor_;
};

}  // namespace crucible
