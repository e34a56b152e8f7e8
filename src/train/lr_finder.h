// The LR finder (`crucible lr-find`): an exponential learning-rate sweep on a run's real model,
// optimizer, batch and data, which suggests the learning rate to train with.
//
// The sweep is a fresh Trainer (the config's init, resume "none") whose schedule is replaced by
//   lr(step) = min_lr * (max_lr / min_lr)^((step - 1) / (steps - 1)),   step = 1 .. steps
// (no warmup, no decay). Every step's global mean loss is smoothed by an exponential moving
// average with bias correction, factor beta (--smoothing, default 0.9). The average trails the
// loss by about beta / (1 - beta) steps (9 at 0.9), so a coarse sweep (few steps per decade)
// notices a blow-up at a later LR than a fine one:
//   average_i = beta * average_{i-1} + (1 - beta) * loss_i,  smoothed_i = average_i / (1 - beta^i)
// The sweep stops at blow-up: the first step whose loss is not finite (or whose update made the
// weights non-finite), or whose smoothed loss exceeds kBlowupFactor x the lowest smoothed loss
// before it. The blow-up LR is that step's LR.
//
// Steepest descent: the LR of the point, among those before the blow-up (not the first
// kSkipStart of the curve, as fastai's skip_start, where the bias-corrected average still
// settles; not the last), where the smoothed loss falls fastest against log(lr): the most
// negative central difference (smoothed_{i+1} - smoothed_{i-1}) / (ln lr_{i+1} - ln lr_{i-1}).
//
// The suggestion is the smaller of blow-up / 10 (the safe default of the reference team)
// and the steepest-descent LR (a short sweep's loss lags its LR, so blow-up / 10 can sit where
// the loss already rises); when the sweep never blew up it is the steepest-descent LR, with a
// blow-up but no steepest descent blow-up / 10; the result says which rule chose it. It is never
// at or past the LR of the step before the blow-up, whose update the blow-up followed from:
// blow-up / 10 is dropped there (a sweep coarser than a decade a step). No suggestion (a
// UsageError saying why) when none is left (too few points before the blow-up: lower --min or
// raise --steps), or when the curve is flat: the smoothed loss before the blow-up never falls
// kFlatFraction below its first value (random tokens, or a range whose LRs never train).
//
// It writes nothing into the config's run directory: the Trainer runs in <out>/run (config.toml,
// metrics.jsonl; checkpoints and validation off, no final weights), and rank 0 writes
// <out>/lr_find.json, <out>/lr_find.svg and, with an apply path, the config with optimizer.lr
// set to the suggestion.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"

namespace crucible {

constexpr double kBlowupFactor = 4.0;
constexpr size_t kSkipStart = 10;
constexpr double kFlatFraction = 0.02;

struct LrFindOptions {
  double min_lr = 1e-6, max_lr = 1.0;
  int64_t steps = 100;
  double smoothing = 0.9;   // beta of the moving average of the loss, in [0, 1)
  std::string out_dir;      // empty: <run directory>-lr-find, beside (never in) the run directory
  std::string apply_path;   // empty: no config copy; its folder must exist
  bool overwrite = false;   // --overwrite: --apply may replace an existing file
  std::string config_path;  // the input file (empty: defaults); --apply may not name it
};

// UsageError (exit 2) naming the option: min_lr or max_lr not positive and finite, min_lr >=
// max_lr, steps < 5, smoothing outside [0, 1), or an apply path that is the input config file.
void CheckLrFindOptions(const LrFindOptions& options);

// The sweep's learning rate at `step` (1 .. steps).
double SweepLearningRate(const LrFindOptions& options, int64_t step);

struct LrSweepPoint {
  int64_t step = 0;
  double lr = 0, loss = 0, smoothed = 0;
};

// The bias-corrected exponential moving average of the losses (factor `beta`) and the blow-up
// rule, fed one step at a time.
class LossSmoother {
 public:
  explicit LossSmoother(double beta) : beta_(beta) {}
  // Returns the smoothed loss through `loss` (NaN once a loss is not finite).
  double Add(double loss);
  // Whether the last smoothed loss is not finite or above kBlowupFactor x the best before it.
  bool blew_up() const { return blew_up_; }

 private:
  double beta_, average_ = 0, beta_power_ = 1, best_ = 0;
  int64_t count_ = 0;
  bool blew_up_ = false;
};

struct LrFindResult {
  std::vector<LrSweepPoint> points;  // every step run; the last is the blow-up when there was one
  std::optional<int64_t> blowup_step;
  double blowup_lr = 0;               // when blowup_step
  std::optional<double> steepest_lr;  // none with fewer than three points before the blow-up
  double suggested_lr = 0;
  std::string suggestion_rule;  // "blowup/10" or "steepest"
};

// The steepest-descent LR, the blow-up and the suggestion of a sweep's points (the rules above).
// UsageError when there is no suggestion: too few points before the blow-up, or a flat curve.
LrFindResult AnalyzeSweep(std::vector<LrSweepPoint> points, std::optional<int64_t> blowup_step);

// The result as JSON text (options, rules, points, blow-up, steepest-descent LR, suggestion).
std::string LrFindJson(const LrFindOptions& options, const LrFindResult& result);

// Runs the sweep on every rank (collective, like training) and, on rank 0, prints the table and
// writes the files. Returns the exit code (0).
int RunLrFind(Config config, const LrFindOptions& options);

}  // namespace crucible
