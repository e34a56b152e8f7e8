#include "optim/optim.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/profile.h"
#include "common/strings.h"

namespace crucible {

OptimizerConfig BuildOptimizerConfig(const Config& config) {
  OptimizerConfig o;
  o.name = config.String("optimizer.name");
  if (o.name != "AdamW" && o.name != "SGD" && o.name != "Lion")
    throw UsageError("optimizer.name: unknown optimizer '" + o.name +
                     "' (choose AdamW, SGD or Lion)");
  o.lr = config.Float("optimizer.lr");
  o.beta1 = config.Float("optimizer.beta1");
  o.beta2 = config.Float("optimizer.beta2");
  o.eps = config.Float("optimizer.eps");
  o.weight_decay = config.Float("optimizer.weight_decay");
  o.decay_norms = config.Bool("optimizer.decay_norms");
  o.decay_embeddings = config.Bool("optimizer.decay_embeddings");
  // Single keys are range-checked by Config::Validate; this is what they mean together.
  // The decoupled decay multiplies the weights by 1 - lr * weight_decay every step.
  if (o.lr * o.weight_decay >= 1)
    throw UsageError(StrFormat(
        "optimizer.lr x optimizer.weight_decay = %g x %g = %g: must be below 1 (the decoupled "
        "weight decay multiplies the weights by 1 - lr x weight_decay every step)",
        o.lr, o.weight_decay, o.lr * o.weight_decay));
  return o;
}

Optimizer::Optimizer(const OptimizerConfig& config, const ParameterTable& table, size_t begin,
                     size_t end)
    : config_(config), begin_(begin), end_(end) {
  for (const auto& p : table.params()) {
    size_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel);
    if (b >= e) continue;
    bool decay = p.kind == ParamKind::kNorm        ? config.decay_norms
                 : p.kind == ParamKind::kEmbedding ? config.decay_embeddings
                                                   : true;
    ranges_.push_back({b, e, decay ? static_cast<float>(config.weight_decay) : 0.0f});
  }
  m_.assign(end - begin, 0.0f);
  if (config.name == "AdamW") v_.assign(end - begin, 0.0f);
}

std::vector<std::pair<std::string, std::vector<float>*>> Optimizer::State() {
  std::vector<std::pair<std::string, std::vector<float>*>> state;
  state.push_back({config_.name == "SGD" ? "momentum" : "exp_avg", &m_});
  // By optimizer, not by size: a rank whose shard is empty still has (empty) AdamW buffers, so
  // every rank walks the same list in collective operations.
  if (config_.name == "AdamW") state.push_back({"exp_avg_sq", &v_});
  return state;
}

void Optimizer::Step(float* params_at_base, const float* grads_at_base, double lr_double,
                     int64_t step, size_t param_base) {
  ScopedKernelTimer profile_timer("optimizer");
  const float lr = static_cast<float>(lr_double);
  const float beta1 = static_cast<float>(config_.beta1), beta2 = static_cast<float>(config_.beta2);
  const float eps = static_cast<float>(config_.eps);
  const float bias1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(step)));
  const float bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(config_.beta2, static_cast<double>(step))));
  for (const Range& range : ranges_) {
    const float decay = 1.0f - lr * range.weight_decay;
    const int64_t b = static_cast<int64_t>(range.begin), e = static_cast<int64_t>(range.end);
    // This range's parameters, gradients and state, from its first element.
    float* params = params_at_base + (range.begin - param_base);
    const float* grads = grads_at_base + (range.begin - param_base);
    float* m = m_.data() + (range.begin - begin_);
    float* v = v_.empty() ? nullptr : v_.data() + (range.begin - begin_);
    const int64_t n = e - b;
    if (config_.name == "AdamW") {
      const float step_size = lr / bias1;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float g = grads[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * (g * g);
        float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
        params[i] = params[i] * decay - step_size * (m[i] / denom);
      }
    } else if (config_.name == "SGD") {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        m[i] = beta1 * m[i] + grads[i];
        params[i] = params[i] * decay - lr * m[i];
      }
    } else {  // Lion (Chen et al. 2023)
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float g = grads[i];
        float update = beta1 * m[i] + (1.0f - beta1) * g;
        float sign = update > 0.0f ? 1.0f : (update < 0.0f ? -1.0f : 0.0f);
        params[i] = params[i] * decay - lr * sign;
        m[i] = beta2 * m[i] + (1.0f - beta2) * g;
      }
    }
  }
}

namespace {
// The last step of the wsd schedule's stable phase: the decay takes the remaining
// max(1, round(total_steps x decay_ratio)) steps.
int64_t WsdDecayStart(const LrScheduleConfig& s) {
  const int64_t decay_steps =
      std::max<int64_t>(1, std::llround(static_cast<double>(s.total_steps) * s.decay_ratio));
  return s.total_steps - decay_steps;
}
}  // namespace

LrScheduleConfig BuildLrScheduleConfig(const Config& config) {
  LrScheduleConfig s;
  s.lr = config.Float("optimizer.lr");
  s.warmup_steps = config.Int("lr_scheduler.warmup_steps");
  s.decay_type = config.String("lr_scheduler.decay_type");
  s.decay_ratio = config.Float("lr_scheduler.decay_ratio");
  s.min_lr_factor = config.Float("lr_scheduler.min_lr_factor");
  s.total_steps = config.Int("training.steps");
  if (s.decay_type != "constant" && s.decay_type != "linear" && s.decay_type != "cosine" &&
      s.decay_type != "wsd")
    throw UsageError("lr_scheduler.decay_type: unknown schedule '" + s.decay_type +
                     "' (choose constant, linear, cosine or wsd)");
  // wsd decays over the last decay_ratio of the steps; a warmup reaching into that decay would
  // end on a jump down instead of a decay from the peak. (The other schedules only ramp for as
  // long as a run shorter than its warmup lasts: it may be resumed with more steps.)
  if (s.decay_type == "wsd" && s.total_steps > 0 && s.warmup_steps > WsdDecayStart(s))
    throw UsageError(StrFormat(
        "lr_scheduler.warmup_steps = %lld reaches into the wsd decay, which starts after step "
        "%lld of training.steps = %lld (lr_scheduler.decay_ratio = %g): lower warmup_steps or "
        "decay_ratio, or raise training.steps",
        (long long)s.warmup_steps, (long long)WsdDecayStart(s), (long long)s.total_steps,
        s.decay_ratio));
  return s;
}

double LearningRate(const LrScheduleConfig& s, int64_t step) {
  if (step <= s.warmup_steps) return s.lr * static_cast<double>(step) / s.warmup_steps;
  const double floor = s.lr * s.min_lr_factor;
  const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  if (s.decay_type == "constant") return s.lr;
  if (s.decay_type == "linear") return floor + (s.lr - floor) * (1.0 - progress);
  if (s.decay_type == "cosine")
    return floor + (s.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
  // wsd: hold the peak, then decay linearly over the last decay_ratio of all steps.
  const int64_t decay_start = WsdDecayStart(s);
  if (step <= decay_start) return s.lr;
  const double fraction =
      std::min(1.0, static_cast<double>(step - decay_start) / (s.total_steps - decay_start));
  return floor + (s.lr - floor) * (1.0 - fraction);
}

float ClipScale(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(grad_norm)) return 1.0f;
  double coefficient = max_norm / (grad_norm + 1e-6);
  return coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
}

}  // namespace crucible
