// What every decoder family shares around its layers, on one process: the device copies of its
// units (off the host), the output head over chunks of token rows (ForwardOptions::kFused and
// kScored, model/model.h) and the loss sum. Llama's plain path (tp_chunks 1) and DeepSeek-V3 run
// these, so the two families give the same bits for the same final-norm rows.
#pragma once

#include <cstdint>
#include <vector>

#include "compute/backend.h"
#include "model/model.h"
#include "model/parameters.h"

namespace crucible {

// A unit's weights and gradients as a backend's kernels read and write them: `access`'s own
// memory on the host; off the host, device copies (weights copied in when acquired, gradients
// copied out when ready), allocated at first use.
class UnitMemory {
 public:
  UnitMemory(const ParameterTable& table, ComputeBackend& backend)
      : table_(table),
        backend_(backend),
        weights_(table.units().size()),
        gradients_(table.units().size()) {}
  const float* Weights(ParameterAccess& access, int unit);
  float* Gradients(ParameterAccess& access, int unit);
  void GradientsReady(ParameterAccess& access, int unit);

 private:
  const ParameterTable& table_;
  ComputeBackend& backend_;
  std::vector<DeviceArray<float>> weights_, gradients_;
};

// RoPE's position tables for a batch of B rows of T tokens whose rows may hold packed documents
// (ForwardOptions::positions): the (T, D/2) tables of positions 0..T-1 on the device, and for a
// packed batch each token's table row gathered into (B*T, D/2), so the RoPE kernels, called with
// batch() = 1 and seq() = B*T, rotate every token by its position in its own document (the same
// table values, so the same bits, as the document at the start of a row of its own).
class RopePositions {
 public:
  RopePositions(ComputeBackend& backend, int64_t B, int64_t T, int64_t D, double theta);
  // Before each Forward: nullptr (positions 0..T-1 in every row) or (B,T) host positions, which
  // must start every row at 0 and either restart at 0 or grow by one (an internal error names
  // the first that does not). The pointer is kept for the Backward: it must stay valid until then.
  void Set(const int32_t* positions);
  // The rows' length of the next Forward (before Set): at most the T it was built for, whose
  // tables' first rows serve any shorter length.
  void SetLength(int64_t T);
  const int32_t* positions() const { return positions_; }  // host; nullptr when not packed
  const float* cos() const { return positions_ ? rows_cos_.data() : cos_.data(); }
  const float* sin() const { return positions_ ? rows_sin_.data() : sin_.data(); }
  int64_t batch() const { return positions_ ? 1 : B_; }
  int64_t seq() const { return positions_ ? B_ * T_ : T_; }
  size_t floats() const { return cos_.size() + sin_.size() + rows_cos_.size() + rows_sin_.size(); }

 private:
  ComputeBackend& backend_;
  int64_t B_, T_, T_max_, half_;
  std::vector<float> host_cos_, host_sin_, host_rows_;
  DeviceArray<float> cos_, sin_, rows_cos_, rows_sin_;  // rows_*: at the first packed batch
  const int32_t* positions_ = nullptr;
};

// The token rows of one chunk of the fused head for N rows of a vocabulary of V: a pure function
// of the shapes (chunks of logits within 16 MiB, yet at least 512 rows, the inner dimension of the
// chunk's weight-gradient product), so every thread count and rank layout gets the same chunks.
int64_t FusedHeadRows(int64_t N, int64_t V);
double FusedHeadRowsPlanned(double N, double V);

// The fused head over all N rows `x` (N, C) against `head` (V, C), chunk by chunk of
// FusedHeadRows: the logits in `chunk` (FusedHeadRows x V), losses and lse (N), the logits'
// gradient in place with `loss_scale` and `weights` (N, nullptr: 1), dx (N, C) overwritten and
// the head's gradient dhead (V, C) overwritten by the first chunk and added to by the others.
// Every pointer is device memory.
void FusedHeadChunks(ComputeBackend& backend, const float* x, const float* head, int64_t N,
                     int64_t C, int64_t V, const int32_t* targets, const float* weights,
                     float loss_scale, float* chunk, float* losses, float* lse, float* dx,
                     float* dhead);
// The scorer's head: the same chunks, losses and lse, and each row's argmax (first of equal
// logits) in host `predictions` (N, -1 where host_targets is -1). `host_chunk` is scratch for a
// chunk's logits off the host.
void ScoredHeadChunks(ComputeBackend& backend, const float* x, const float* head, int64_t N,
                      int64_t C, int64_t V, const int32_t* targets, const int32_t* host_targets,
                      float* chunk, float* losses, float* lse, int32_t* predictions,
                      std::vector<float>* host_chunk);

// LossSum of host `losses` (N) over the positions whose target is not -1, in position order,
// weighted by `weights` (nullptr: 1).
LossSum SumLosses(const float* losses, const int32_t* targets, const float* weights, int64_t N);

}  // namespace crucible
