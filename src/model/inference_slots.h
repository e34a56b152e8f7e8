// What every family's inference path (model/model.h InferenceModel) keeps the same way: its
// sequence slots, how many positions each holds, the checks of a prefill and a decode step
// against them, its backend, its scratch (counted as it is allocated) and RoPE tables. A family
// derives from it and writes only its layers and cache layout (CopyCache says where a slot's
// positions lie).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace crucible {

class InferenceSlots : public InferenceModel {
 public:
  int64_t slots() const override { return slots_; }
  int64_t max_len() const override { return max_len_; }
  int64_t length(int64_t slot) const override { return lengths_.at(CheckSlot(slot)); }
  void Free(int64_t slot) override { lengths_[CheckSlot(slot)] = 0; }
  // Checks the slots (model.h), has the family copy the positions, then sets the length.
  void CopySlot(int64_t from, int64_t to) final;
  size_t scratch_bytes() const override { return scratch_bytes_; }

 protected:
  // `slots` >= 1 sequences of up to `max_len` >= 1 positions (an internal error otherwise).
  InferenceSlots(int64_t slots, int64_t max_len, std::shared_ptr<ComputeBackend> backend);

  // `n` zeroed elements of backend memory, counted in scratch_bytes() (not for the KV cache).
  template <typename T>
  DeviceArray<T> Scratch(int64_t n) {
    scratch_bytes_ += static_cast<size_t>(n) * sizeof(T);
    return DeviceArray<T>(*backend_, static_cast<size_t>(n));
  }
  // The RoPE tables of every position, (max_len, D/2) each, in scratch.
  void RopeTables(int64_t D, double theta, DeviceArray<float>* cos, DeviceArray<float>* sin);

  // `slot` as an index; an internal error when it is outside [0, slots).
  size_t CheckSlot(int64_t slot) const;
  // Before a prefill of `count` tokens into `slot`: the slot must be empty (internal error) and
  // the prompt must fit (Error, exit 2, naming the slot and the limit). Returns the index.
  size_t BeginPrefill(int64_t slot, int64_t count) const;
  // Before a decode step of one token for each of the `n` distinct, non-empty `slots`: the
  // position each token takes (its slot's length) and the length after it; Error (exit 2) naming
  // a full slot, internal errors for n outside [1, slots], a repeated or an empty slot.
  struct DecodePlan {
    std::vector<int64_t> positions, lengths;
  };
  DecodePlan BeginDecode(const int64_t* slots, int64_t n) const;
  // After the step: each slot holds one more position.
  void EndDecode(const int64_t* slots, const DecodePlan& plan);
  void SetLength(size_t slot, int64_t length) { lengths_[slot] = length; }
  // Copies positions [0, length) of every layer's keys and values of slot `from` into slot `to`
  // (distinct valid slots, checked by CopySlot), with CopyFloats.
  virtual void CopyCache(int64_t from, int64_t to, int64_t length) = 0;
  // `n` floats of backend memory from `from` to `to` (not overlapping), bit for bit: a memcpy on
  // host memory; elsewhere through a host buffer, with the backend's own copies (CopyToHost,
  // CopyToDevice, each of which waits for the work issued before it).
  void CopyFloats(float* to, const float* from, size_t n);

  int64_t slots_, max_len_;
  std::shared_ptr<ComputeBackend> backend_;

 private:
  std::vector<int64_t> lengths_;  // per slot
  std::vector<float> staging_;    // CopyFloats' host buffer off host memory
  size_t scratch_bytes_ = 0;
};

}  // namespace crucible
