#include "model/inference_slots.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

InferenceSlots::InferenceSlots(int64_t slots, int64_t max_len,
                               std::shared_ptr<ComputeBackend> backend)
    : slots_(slots),
      max_len_(max_len),
      backend_(std::move(backend)),
      lengths_(static_cast<size_t>(slots > 0 ? slots : 0), 0) {
  if (slots < 1 || max_len < 1)
    throw Error(kExitFailure, "internal: an inference model needs slots >= 1 and max_len >= 1");
}

void InferenceSlots::RopeTables(int64_t D, double theta, DeviceArray<float>* cos,
                                DeviceArray<float>* sin) {
  std::vector<float> cos_table(static_cast<size_t>(max_len_ * D / 2)), sin_table(cos_table.size());
  kernels::rope_tables(cos_table.data(), sin_table.data(), max_len_, D, theta);
  *cos = Scratch<float>(max_len_ * D / 2);
  *sin = Scratch<float>(max_len_ * D / 2);
  cos->CopyFrom(cos_table.data(), cos_table.size());
  sin->CopyFrom(sin_table.data(), sin_table.size());
}

size_t InferenceSlots::CheckSlot(int64_t slot) const {
  if (slot < 0 || slot >= slots_)
    throw Error(kExitFailure, "internal: sequence slot " + std::to_string(slot) + " outside [0, " +
                                  std::to_string(slots_) + ")");
  return static_cast<size_t>(slot);
}

size_t InferenceSlots::BeginPrefill(int64_t slot, int64_t count) const {
  const size_t s = CheckSlot(slot);
  if (lengths_[s] != 0)
    throw Error(kExitFailure, "internal: prefill of sequence slot " + std::to_string(slot) +
                                  ", which holds " + std::to_string(lengths_[s]) + " positions");
  if (count < 1 || count > max_len_)
    throw Error(kExitUsage, "sequence slot " + std::to_string(slot) + ": a prompt of " +
                                std::to_string(count) + " tokens does not fit the KV cache of " +
                                std::to_string(max_len_) + " positions");
  return s;
}

InferenceSlots::DecodePlan InferenceSlots::BeginDecode(const int64_t* slots, int64_t n) const {
  if (n < 1 || n > slots_)
    throw Error(kExitFailure, "internal: a decode step of " + std::to_string(n) + " rows for " +
                                  std::to_string(slots_) + " slots");
  DecodePlan plan;
  plan.positions.resize(static_cast<size_t>(n));
  plan.lengths.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const size_t s = CheckSlot(slots[i]);
    for (int64_t j = 0; j < i; ++j)
      if (slots[j] == slots[i])
        throw Error(kExitFailure,
                    "internal: slot " + std::to_string(slots[i]) + " twice in one decode step");
    if (lengths_[s] == 0)
      throw Error(kExitFailure,
                  "internal: decode of empty sequence slot " + std::to_string(slots[i]));
    if (lengths_[s] >= max_len_)
      throw Error(kExitUsage, "sequence slot " + std::to_string(slots[i]) + " is full: its " +
                                  std::to_string(lengths_[s]) + " positions fill the KV cache of " +
                                  std::to_string(max_len_));
    plan.positions[static_cast<size_t>(i)] = lengths_[s];
    plan.lengths[static_cast<size_t>(i)] = lengths_[s] + 1;
  }
  return plan;
}

void InferenceSlots::CopySlot(int64_t from, int64_t to) {
  const size_t f = CheckSlot(from), t = CheckSlot(to);
  if (from == to)
    throw Error(kExitFailure,
                "internal: copy of sequence slot " + std::to_string(from) + " onto itself");
  if (lengths_[f] == 0)
    throw Error(kExitFailure, "internal: copy of empty sequence slot " + std::to_string(from));
  if (lengths_[t] != 0)
    throw Error(kExitFailure, "internal: copy into sequence slot " + std::to_string(to) +
                                  ", which holds " + std::to_string(lengths_[t]) + " positions");
  CopyCache(from, to, lengths_[f]);
  lengths_[t] = lengths_[f];
}

void InferenceSlots::CopyFloats(float* to, const float* from, size_t n) {
  if (n == 0) return;
  if (backend_->host_memory()) {
    std::memcpy(to, from, n * sizeof(float));
    return;
  }
  staging_.resize(n);
  backend_->CopyToHost(staging_.data(), from, n * sizeof(float));
  backend_->CopyToDevice(to, staging_.data(), n * sizeof(float));
}

void InferenceSlots::EndDecode(const int64_t* slots, const DecodePlan& plan) {
  for (size_t i = 0; i < plan.lengths.size(); ++i) lengths_[CheckSlot(slots[i])] = plan.lengths[i];
}

}  // namespace crucible
