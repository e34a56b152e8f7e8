#include "train/detectors.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"

namespace crucible {

namespace {
// Half the distance to the next representable value of |x| with `mantissa_bits` stored bits.
double HalfUlp(float x, int mantissa_bits) {
  int exponent = 0;
  double m =
      std::frexp(std::fabs(static_cast<double>(x)), &exponent);  // |x| = m 2^e, m in [0.5, 1)
  if (m == 0.0) exponent = -125;
  return std::ldexp(0.5, exponent - 1 - mantissa_bits);
}
}  // namespace

Detectors::Detectors(const Config& config, const ParameterTable& table, size_t begin, size_t end)
    : enabled_(config.Bool("debug.detectors")),
      frozen_steps_(config.Int("debug.frozen_steps")),
      initial_loss_tolerance_(config.Float("debug.initial_loss_tolerance")),
      begin_(begin),
      end_(end),
      table_(table) {
  const std::string& dtype = config.String("training.master_dtype");
  if (dtype != "float32" && dtype != "bfloat16")
    throw UsageError("training.master_dtype: expected float32 or bfloat16, got '" + dtype + "'");
  bf16_storage_ = dtype == "bfloat16";
  for (const auto& p : table.params()) {
    // A balance bias is no optimizer's (optim/balance_bias.h): model.bias_update_speed = 0 keeps
    // it still on purpose, and it stays float32 under bf16 storage (as DeepSeek-V3 keeps it).
    if (p.kind == ParamKind::kBalanceBias) continue;
    size_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel);
    if (b < e)
      ranges_.push_back({p.name, b, e, std::max<size_t>(1, (e - b + kSample - 1) / kSample)});
  }
}

void Detectors::CheckFirstLoss(double loss, int64_t vocab_size) {
  if (!enabled_) return;
  const double expected = std::log(static_cast<double>(vocab_size));
  if (std::fabs(loss - expected) > initial_loss_tolerance_)
    LogWarn(
        StrFormat("step-1 loss %.4f is %.2f away from ln(vocab_size) = %.4f expected of a fresh "
                  "model: is the loss scaled (e.g. divided by the data-parallel size) or the "
                  "init broken?",
                  loss, loss - expected, expected));
}

std::string Detectors::FindNonFinite(const float* grads, size_t begin, size_t end) const {
  for (const ParamInfo& p : table_.params()) {
    const size_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel);
    for (size_t i = b; i < e; ++i)
      if (!std::isfinite(grads[i - begin]))
        return StrFormat("%s (element %zu = %g)", p.name.c_str(), i - p.offset, grads[i - begin]);
  }
  return "";
}

void Detectors::BeforeUpdate(const float* weights, size_t base) {
  if (!enabled_) return;
  before_.clear();
  for (const Range& r : ranges_)
    for (size_t i = r.begin; i < r.end; i += r.stride) before_.push_back(weights[i - base]);
}

void Detectors::AfterUpdate(float* weights, int64_t step, size_t base) {
  if (!enabled_ && !bf16_storage_) return;
  if (!enabled_) {
    for (Range& r : ranges_)
      for (size_t i = r.begin; i < r.end; ++i)
        weights[i - base] = RoundToBfloat16(weights[i - base]);
    return;
  }
  const int mantissa_bits = bf16_storage_ ? 7 : 23;
  const char* precision = bf16_storage_ ? "bfloat16" : "float32";
  size_t sample = 0;
  for (Range& r : ranges_) {
    if (enabled_) {
      // Typical update and half-ULP over a fixed sample of up to kSample elements.
      double update = 0.0, half_ulp = 0.0, n = 0.0;
      for (size_t i = r.begin; i < r.end; i += r.stride, ++sample) {
        float old = before_[sample];
        update += std::fabs(static_cast<double>(weights[i - base]) - old);
        half_ulp += HalfUlp(old, mantissa_bits);
        n += 1.0;
      }
      // Below half a ULP on frozen_steps consecutive steps (one step could be warmup).
      r.below_ulp_steps = (update > 0.0 && update < half_ulp) ? r.below_ulp_steps + 1 : 0;
      if (!r.warned_ulp && frozen_steps_ > 0 && r.below_ulp_steps >= frozen_steps_) {
        LogWarn(
            StrFormat("frozen parameter %s: typical update %.3g is below half a %s ULP (%.3g) "
                      "of its values for %lld steps, so storing it rounds the update away "
                      "(step %lld)",
                      r.name.c_str(), update / n, precision, half_ulp / n,
                      (long long)r.below_ulp_steps, (long long)step));
        r.warned_ulp = true;
      }
    }
    if (bf16_storage_)
      for (size_t i = r.begin; i < r.end; ++i)
        weights[i - base] = RoundToBfloat16(weights[i - base]);
    if (enabled_ && !r.warned_unchanged && frozen_steps_ > 0) {
      uint64_t h = Hash64(weights + (r.begin - base), (r.end - r.begin) * sizeof(float));
      r.unchanged_steps = (h == r.last_hash) ? r.unchanged_steps + 1 : 0;
      r.last_hash = h;
      if (r.unchanged_steps >= frozen_steps_) {
        LogWarn(StrFormat("frozen parameter %s: unchanged for %lld steps (step %lld)",
                          r.name.c_str(), (long long)r.unchanged_steps, (long long)step));
        r.warned_unchanged = true;
      }
    }
  }
}

}  // namespace crucible
