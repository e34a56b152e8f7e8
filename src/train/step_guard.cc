#include "train/step_guard.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/log.h"
#include "common/strings.h"

namespace crucible {

StepGuard::StepGuard(const GuardConfig& config, bool leader,
                     std::function<std::string(int64_t)> last_checkpoint)
    : config_(config), leader_(leader), last_checkpoint_(std::move(last_checkpoint)) {}

bool StepGuard::SkipUpdate(int64_t step, double loss, double grad_norm) {
  WarnOnRise(step, grad_norm);
  std::string why;
  bool spike = false, non_finite = false;
  if (std::find(config_.skip_steps.begin(), config_.skip_steps.end(), step) !=
      config_.skip_steps.end()) {
    why = "listed in debug.skip_steps";
  } else if (!std::isfinite(loss)) {
    why = StrFormat("non-finite loss: %s", FormatValue(loss).c_str());
    non_finite = true;
  } else if (!std::isfinite(grad_norm)) {
    why = "non-finite gradient norm";
    non_finite = true;
  } else if (config_.spike_metric != SpikeMetric::kOff) {
    why = SpikeReason(config_.spike_metric == SpikeMetric::kLoss ? loss : grad_norm);
    spike = !why.empty();
  }
  if (why.empty()) {
    consecutive_skips_ = consecutive_spikes_ = 0;
    if (config_.spike_metric != SpikeMetric::kOff)
      Accept(config_.spike_metric == SpikeMetric::kLoss ? loss : grad_norm);
    return false;
  }
  ++skipped_;
  if (consecutive_skips_++ == 0) streak_non_finite_ = non_finite;
  consecutive_spikes_ = spike ? consecutive_spikes_ + 1 : 0;
  if (leader_)
    LogWarn(StrFormat("step %lld: update skipped (%s); skipped=%lld, %lld in a row",
                      (long long)step, why.c_str(), (long long)skipped_,
                      (long long)consecutive_skips_));
  if (config_.spike_limit > 0 && consecutive_spikes_ >= config_.spike_limit)
    Stop(step,
         StrFormat("%lld loss spikes in a row since step %lld (training.spike_limit = %lld)",
                   (long long)consecutive_spikes_, (long long)(step - consecutive_spikes_ + 1),
                   (long long)config_.spike_limit));
  if (config_.max_consecutive_skips > 0 && consecutive_skips_ >= config_.max_consecutive_skips)
    Stop(step,
         StrFormat("%lld updates skipped in a row since step %lld (training.max_consecutive_skips "
                   "= %lld)",
                   (long long)consecutive_skips_, (long long)(step - consecutive_skips_ + 1),
                   (long long)config_.max_consecutive_skips));
  return true;
}

std::string StepGuard::SpikeReason(double value) const {
  const size_t n = window_.size();
  if (n < static_cast<size_t>(config_.spike_warmup)) return "";
  // In window order, so every rank and a resumed run get the same bits.
  double sum = 0;
  for (double v : window_) sum += v;
  const double mean = sum / static_cast<double>(n);
  double squares = 0;
  for (double v : window_) squares += (v - mean) * (v - mean);
  const double deviation = std::sqrt(squares / static_cast<double>(n));
  const double threshold = mean + config_.spike_k * deviation;
  if (!(value > threshold)) return "";
  return StrFormat("%s spike: %.6g > mean %.6g + %g x std %.6g of the last %zu accepted steps",
                   config_.spike_metric == SpikeMetric::kLoss ? "loss" : "grad_norm", value, mean,
                   config_.spike_k, deviation, n);
}

void StepGuard::Accept(double value) {
  window_.push_back(value);
  while (window_.size() > static_cast<size_t>(config_.spike_window)) window_.pop_front();
}

void StepGuard::WarnOnRise(int64_t step, double grad_norm) {
  const double previous = previous_norm_;
  previous_norm_ = grad_norm;
  if (!(config_.grad_norm_rise_warn > 0) || !leader_ || !(previous > 0)) return;
  if (std::isfinite(grad_norm) && grad_norm <= config_.grad_norm_rise_warn * previous) return;
  LogWarn(
      StrFormat("step %lld: the gradient norm rose from %.6g to %.6g in one step (more than "
                "training.grad_norm_rise_warn = %g times)",
                (long long)step, previous, grad_norm, config_.grad_norm_rise_warn));
}

void StepGuard::Stop(int64_t step, const std::string& why) const {
  const int64_t streak_began = step - consecutive_skips_ + 1;
  throw Error(kExitDiverged,
              StrFormat("step %lld: %s: training stopped; nothing of this step was saved; roll "
                        "back to the last checkpoint: %s",
                        (long long)step, why.c_str(),
                        last_checkpoint_(streak_non_finite_ ? streak_began : 0).c_str()));
}

nlohmann::json StepGuard::State() const {
  return {{"skipped", skipped_},
          {"consecutive_skips", consecutive_skips_},
          {"consecutive_spikes", consecutive_spikes_},
          {"window", std::vector<double>(window_.begin(), window_.end())},
          {"previous_grad_norm", std::isfinite(previous_norm_) ? nlohmann::json(previous_norm_)
                                                               : nlohmann::json(nullptr)}};
}

void StepGuard::Restore(const nlohmann::json& state) {
  if (state.is_null()) return;
  try {
    skipped_ = state.at("skipped").get<int64_t>();
    consecutive_skips_ = state.at("consecutive_skips").get<int64_t>();
    consecutive_spikes_ = state.at("consecutive_spikes").get<int64_t>();
    window_.clear();
    for (const nlohmann::json& v : state.at("window")) Accept(v.get<double>());
    const nlohmann::json& previous = state.at("previous_grad_norm");
    previous_norm_ = previous.is_number() ? previous.get<double>() : NAN;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(std::string("state.json: guards: ") + e.what());
  }
}

}  // namespace crucible
