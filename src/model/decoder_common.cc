#include "model/decoder_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

RopePositions::RopePositions(ComputeBackend& backend, int64_t B, int64_t T, int64_t D, double theta)
    : backend_(backend), B_(B), T_(T), T_max_(T), half_(D / 2) {
  host_cos_.resize(static_cast<size_t>(T * half_));
  host_sin_.resize(host_cos_.size());
  kernels::rope_tables(host_cos_.data(), host_sin_.data(), T, D, theta);
  cos_ = DeviceArray<float>(backend, host_cos_.size());
  sin_ = DeviceArray<float>(backend, host_sin_.size());
  cos_.CopyFrom(host_cos_.data(), host_cos_.size());
  sin_.CopyFrom(host_sin_.data(), host_sin_.size());
}

void RopePositions::SetLength(int64_t T) {
  if (T < 1 || T > T_max_)
    throw Error(kExitFailure, StrFormat("internal: RoPE rows of %lld positions, built for %lld",
                                        (long long)T, (long long)T_max_));
  T_ = T;
}

void RopePositions::Set(const int32_t* positions) {
  positions_ = positions;
  if (!positions) return;
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      const int32_t p = positions[b * T_ + t];
      const bool ok = t == 0 ? p == 0 : p == 0 || p == positions[b * T_ + t - 1] + 1;
      if (!ok)
        throw Error(kExitFailure,
                    StrFormat("internal: packed positions: row %lld, token %lld is at position "
                              "%d (each row starts at 0; a position is 0 or one more than the "
                              "last)",
                              (long long)b, (long long)t, p));
    }
  const size_t n = static_cast<size_t>(B_ * T_ * half_);
  if (!rows_cos_.data()) {  // for the longest rows
    rows_cos_ = DeviceArray<float>(backend_, static_cast<size_t>(B_ * T_max_ * half_));
    rows_sin_ = DeviceArray<float>(backend_, static_cast<size_t>(B_ * T_max_ * half_));
  }
  host_rows_.resize(n);
  for (const auto& [table, rows] :
       {std::pair{&host_cos_, &rows_cos_}, std::pair{&host_sin_, &rows_sin_}}) {
    for (int64_t i = 0; i < B_ * T_; ++i)
      std::memcpy(host_rows_.data() + i * half_, table->data() + positions[i] * half_,
                  static_cast<size_t>(half_) * sizeof(float));
    rows->CopyFrom(host_rows_.data(), n);
  }
}

const float* UnitMemory::Weights(ParameterAccess& access, int unit) {
  const float* host = access.AcquireWeights(unit);
  if (backend_.host_memory()) return host;
  const ParamUnit& u = table_.units()[unit];
  auto& device = weights_[unit];
  if (!device.data()) device = DeviceArray<float>(backend_, u.size());
  device.CopyFrom(host, u.size());
  return device.data();
}

float* UnitMemory::Gradients(ParameterAccess& access, int unit) {
  float* host = access.Gradients(unit);
  if (backend_.host_memory()) return host;
  const ParamUnit& u = table_.units()[unit];
  auto& device = gradients_[unit];
  if (!device.data()) device = DeviceArray<float>(backend_, u.size());
  return device.data();
}

void UnitMemory::GradientsReady(ParameterAccess& access, int unit) {
  if (!backend_.host_memory()) {
    const ParamUnit& u = table_.units()[unit];
    gradients_[unit].CopyTo(access.Gradients(unit), u.size());
  }
  access.GradientsReady(unit);
}

double FusedHeadRowsPlanned(double N, double V) {
  constexpr double kChunkFloats = 4.0 * 1024 * 1024, kMinRows = 512;
  return std::min(N, std::max(kMinRows, std::floor(kChunkFloats / std::max(1.0, V))));
}

int64_t FusedHeadRows(int64_t N, int64_t V) {
  return static_cast<int64_t>(FusedHeadRowsPlanned(static_cast<double>(N), static_cast<double>(V)));
}

void FusedHeadChunks(ComputeBackend& be, const float* x, const float* head, int64_t N, int64_t C,
                     int64_t V, const int32_t* targets, const float* weights, float loss_scale,
                     float* chunk, float* losses, float* lse, float* dx, float* dhead) {
  const int64_t rows = FusedHeadRows(N, V);
  // Per chunk of rows: logits, losses and lse, dlogits in place, then dx rows = dlogits W and the
  // head's gradient += dlogits^T x (the first chunk overwrites it).
  for (int64_t r = 0; r < N; r += rows) {
    const int64_t n = std::min(rows, N - r);
    be.MatmulForward(chunk, x + r * C, head, n, C, V);
    be.CrossEntropyForward(losses + r, lse + r, chunk, targets + r, n, V);
    be.CrossEntropyBackward(chunk, lse + r, targets + r, n, V, loss_scale,
                            weights ? weights + r : nullptr);
    be.MatmulBackward(dx + r * C, dhead, chunk, x + r * C, head, n, C, V, false, r > 0);
  }
}

void ScoredHeadChunks(ComputeBackend& be, const float* x, const float* head, int64_t N, int64_t C,
                      int64_t V, const int32_t* targets, const int32_t* host_targets, float* chunk,
                      float* losses, float* lse, int32_t* predictions,
                      std::vector<float>* host_chunk) {
  const int64_t rows = FusedHeadRows(N, V);
  if (!be.host_memory()) host_chunk->resize(rows * V);
  for (int64_t r = 0; r < N; r += rows) {
    const int64_t n = std::min(rows, N - r);
    be.MatmulForward(chunk, x + r * C, head, n, C, V);
    be.CrossEntropyForward(losses + r, lse + r, chunk, targets + r, n, V);
    const float* logits = chunk;
    if (!be.host_memory()) {
      be.CopyToHost(host_chunk->data(), chunk, n * V * sizeof(float));
      logits = host_chunk->data();
    }
    const int32_t* t = host_targets + r;
    int32_t* predicted = predictions + r;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] < 0) continue;
      const float* row = logits + i * V;
      predicted[i] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  }
}

LossSum SumLosses(const float* losses, const int32_t* targets, const float* weights, int64_t N) {
  // In position order; without weights each w_i is 1 and w_i * l_i is l_i exactly.
  LossSum sum;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    const double w = weights ? static_cast<double>(weights[i]) : 1.0;
    sum.loss += w * losses[i];
    sum.weight += w;
  }
  return sum;
}

}  // namespace crucible
