// Silent-bug detectors of the training loop, on by default ([debug] detectors = false turns them
// off). Each finding is one warning line naming the tensor and the numbers:
//  - a parameter tensor unchanged for [debug] frozen_steps consecutive steps;
//  - a tensor whose typical update stays below half the ULP of its stored precision for
//    [debug] frozen_steps steps, so rounding
//    to storage throws every update away (bf16 master weights froze every RMSNorm weight at
//    exactly 1.0 for 17,000 steps in a real run); [training] master_dtype = "bfloat16" emulates
//    that storage by rounding the weights to bf16 after every update;
//  - a step-1 loss far from ln(vocab) for a freshly initialised model (e.g. a loss divided by
//    the data-parallel size);
//  - a non-finite gradient, named by tensor on the step it appears (before the loss follows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/bfloat16.h"  // RoundToBfloat16, which detectors apply
#include "common/config.h"
#include "model/parameters.h"

namespace crucible {

class Detectors {
 public:
  // [begin, end) is the part of the flat buffer this rank updates.
  Detectors(const Config& config, const ParameterTable& table, size_t begin, size_t end);

  bool bf16_storage() const { return bf16_storage_; }
  // Warns when a fresh model's first loss is more than the tolerance away from ln(vocab).
  void CheckFirstLoss(double loss, int64_t vocab_size);
  // Name of the first tensor holding a non-finite value in grads[begin, end) (grads[i - begin]
  // is element i of the flat buffer), and the element; "" if none.
  std::string FindNonFinite(const float* grads, size_t begin, size_t end) const;
  // Call before the optimizer step (remembers a fixed sample of the values it changes) ...
  // weights[i - base] is element i of the flat buffer (base > 0 for a ZeRO-3 shard).
  void BeforeUpdate(const float* weights, size_t base = 0);
  // ... and after it: compares intended updates with half a ULP of the stored precision,
  // applies bf16 storage when configured, and tracks tensors that stay unchanged.
  void AfterUpdate(float* weights, int64_t step, size_t base = 0);

 private:
  struct Range {
    std::string name;
    size_t begin, end;  // clipped to this rank's part
    size_t stride;      // sampling stride of the ULP check
    uint64_t last_hash = 0;
    int64_t unchanged_steps = 0;
    int64_t below_ulp_steps = 0;
    bool warned_ulp = false, warned_unchanged = false;
  };
  static constexpr size_t kSample = 1024;
  bool enabled_;
  bool bf16_storage_;
  int64_t frozen_steps_;
  double initial_loss_tolerance_;
  size_t begin_, end_;
  const ParameterTable& table_;
  std::vector<Range> ranges_;
  std::vector<float> before_;
};

}  // namespace crucible
