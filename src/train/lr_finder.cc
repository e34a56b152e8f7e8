#include "train/lr_finder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "data/stages.h"
#include "train/lr_find_plot.h"
#include "train/trainer.h"

namespace crucible {

namespace {

// The absolute, normalised form of a path (without a trailing separator).
std::string Canonical(const std::string& path) {
  std::string canonical =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path)).lexically_normal();
  while (canonical.size() > 1 && canonical.back() == '/') canonical.pop_back();
  return canonical;
}

// Whether `path` is `folder` or lies under it.
bool IsInside(const std::string& path, const std::string& folder) {
  const std::string p = Canonical(path), f = Canonical(folder);
  return p == f || StartsWith(p, f + "/");
}

// Records each step of the sweep and stops the run at blow-up (every rank sees the same global
// loss, so every rank stops at the same step).
class SweepHook : public TrainerHook {
 public:
  SweepHook(const LrFindOptions& options, bool leader, std::vector<LrSweepPoint>& points,
            std::optional<int64_t>& blowup_step)
      : options_(options),
        leader_(leader),
        points_(points),
        blowup_step_(blowup_step),
        smoother_(options.smoothing) {}

  std::optional<int> AfterStep(const StepReport& report) override {
    const double smoothed = smoother_.Add(report.loss);
    points_.push_back({report.step, report.lr, report.loss, smoothed});
    if (leader_ && !std::isfinite(report.loss))  // the step guard skipped its update
      PrintLine(StrFormat("phase=lr_find step=%lld/%lld lr=%.6g status=diverged loss=%s",
                          (long long)report.step, (long long)options_.steps, report.lr,
                          FormatValue(report.loss).c_str()));
    else if (leader_)
      PrintLine(StrFormat("phase=lr_find step=%lld/%lld lr=%.6g loss=%.6f smoothed=%.6f",
                          (long long)report.step, (long long)options_.steps, report.lr, report.loss,
                          smoothed));
    if (!smoother_.blew_up()) return std::nullopt;
    blowup_step_ = report.step;
    return kExitOk;
  }

 private:
  const LrFindOptions& options_;
  bool leader_;
  std::vector<LrSweepPoint>& points_;
  std::optional<int64_t>& blowup_step_;
  LossSmoother smoother_;
};

void PrintTable(const LrFindResult& result) {
  PrintLine(StrFormat("%6s  %-12s  %-12s  %-12s", "step", "lr", "loss", "smoothed"));
  for (const LrSweepPoint& p : result.points)
    PrintLine(
        StrFormat("%6lld  %-12.4e  %-12.6f  %-12.6f", (long long)p.step, p.lr, p.loss, p.smoothed));
}

}  // namespace

void CheckLrFindOptions(const LrFindOptions& options) {
  for (const auto& [name, value] : {std::pair{"--min", options.min_lr}, {"--max", options.max_lr}})
    if (!(value > 0) || !std::isfinite(value))
      throw UsageError(
          StrFormat("%s = %g: the learning rate must be a positive number", name, value));
  if (options.min_lr >= options.max_lr)
    throw UsageError(
        StrFormat("--min (%g) must be below --max (%g)", options.min_lr, options.max_lr));
  if (options.steps < 5)
    throw UsageError(
        StrFormat("--steps = %lld: the sweep needs at least 5 steps", (long long)options.steps));
  if (!(options.smoothing >= 0 && options.smoothing < 1))
    throw UsageError(StrFormat("--smoothing = %g: the moving-average factor must be in [0, 1)",
                               options.smoothing));
  if (!options.apply_path.empty() && !options.config_path.empty() &&
      Canonical(options.apply_path) == Canonical(options.config_path))
    throw UsageError("--apply " + options.apply_path +
                     " is the input config: the LR finder writes a copy, never over --config");
  // Checked before the sweep, so a sweep's result is never lost at its end.
  if (!options.apply_path.empty()) {
    const std::string parent = ParentDirectory(options.apply_path);
    if (!parent.empty() && !IsDirectory(parent))
      throw UsageError("--apply " + options.apply_path + ": the folder " + parent +
                       " does not exist (create it, or name a file in an existing folder)");
    struct stat st;
    if (!options.overwrite && ::stat(options.apply_path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      throw UsageError("--apply " + options.apply_path +
                       ": exists; give --overwrite to replace it, or name a new file");
  }
}

double SweepLearningRate(const LrFindOptions& options, int64_t step) {
  const double fraction = static_cast<double>(step - 1) / static_cast<double>(options.steps - 1);
  return options.min_lr * std::pow(options.max_lr / options.min_lr, fraction);
}

double LossSmoother::Add(double loss) {
  ++count_;
  average_ = beta_ * average_ + (1.0 - beta_) * loss;
  beta_power_ *= beta_;
  const double smoothed = average_ / (1.0 - beta_power_);
  if (!std::isfinite(smoothed) || (count_ > 1 && smoothed > kBlowupFactor * best_)) blew_up_ = true;
  if (count_ == 1 || smoothed < best_) best_ = smoothed;
  return std::isfinite(smoothed) ? smoothed : std::nan("");
}

LrFindResult AnalyzeSweep(std::vector<LrSweepPoint> points, std::optional<int64_t> blowup_step) {
  LrFindResult result;
  result.points = std::move(points);
  result.blowup_step = blowup_step;
  // The points before the blow-up: the last point is the blow-up when there was one.
  size_t usable = result.points.size();
  if (blowup_step) {
    result.blowup_lr = result.points.back().lr;
    --usable;
  }
  double steepest = std::numeric_limits<double>::infinity();
  for (size_t i = std::max<size_t>(1, kSkipStart); i + 1 < usable; ++i) {
    const LrSweepPoint &before = result.points[i - 1], &after = result.points[i + 1];
    const double slope =
        (after.smoothed - before.smoothed) / (std::log(after.lr) - std::log(before.lr));
    if (slope < steepest) {
      steepest = slope;
      result.steepest_lr = result.points[i].lr;
    }
  }
  // A curve that never falls has nothing to suggest: its steepest descent is noise.
  if (usable >= 3) {
    double best = result.points[0].smoothed;
    for (size_t i = 1; i < usable; ++i) best = std::min(best, result.points[i].smoothed);
    const double first = result.points[0].smoothed;
    if (!(first - best >= kFlatFraction * std::fabs(first)))
      throw UsageError(StrFormat(
          "the LR sweep's curve is flat: over its %zu points from lr %.3g to %.3g the smoothed "
          "loss fell from %.6g to %.6g at best, less than %g%%: no learning rate to suggest (the "
          "loss of random tokens stays at ln(vocab) whatever the LR; with real data, raise --max)",
          usable, result.points[0].lr, result.points[usable - 1].lr, first, best,
          100 * kFlatFraction));
  }
  // Never at or past the LR of the step before the blow-up: that step's update gave it.
  const bool blowup_fits =
      blowup_step &&
      (usable > 0 && result.blowup_lr / 10.0 < result.points[usable - 1].lr * (1.0 - 1e-9));
  // The smaller of blow-up / 10 and the steepest descent: a short sweep's loss lags its LR, so
  // blow-up / 10 can land where the loss already rises (seen on `tiny`, 4 steps per decade).
  if (blowup_fits && !(result.steepest_lr && *result.steepest_lr < result.blowup_lr / 10.0)) {
    result.suggested_lr = result.blowup_lr / 10.0;
    result.suggestion_rule = "blowup/10";
  } else if (result.steepest_lr) {
    result.suggested_lr = *result.steepest_lr;
    result.suggestion_rule = "steepest";
  } else if (blowup_step) {
    throw UsageError(StrFormat(
        "the LR sweep blew up at step %lld (lr %.3g) with %zu point%s before it: too few points "
        "to suggest a learning rate from (blow-up / 10 = %.3g is not below %.3g, the lr whose "
        "update the blow-up followed; a steepest descent needs %zu points): lower --min or raise "
        "--steps",
        (long long)*blowup_step, result.blowup_lr, usable, usable == 1 ? "" : "s",
        result.blowup_lr / 10.0, usable > 0 ? result.points[usable - 1].lr : result.blowup_lr,
        kSkipStart + 2));
  } else {
    throw UsageError(StrFormat(
        "the LR sweep has too few points (%zu) to suggest a learning rate from: a steepest "
        "descent needs %zu; raise --steps",
        usable, kSkipStart + 2));
  }
  return result;
}

std::string LrFindJson(const LrFindOptions& options, const LrFindResult& result) {
  nlohmann::json points = nlohmann::json::array();
  for (const LrSweepPoint& p : result.points)
    points.push_back({{"step", p.step}, {"lr", p.lr}, {"loss", p.loss}, {"smoothed", p.smoothed}});
  nlohmann::json json = {
      {"min_lr", options.min_lr},
      {"max_lr", options.max_lr},
      {"steps", options.steps},
      {"smoothing_beta", options.smoothing},
      {"blowup_factor", kBlowupFactor},
      {"blowup_step", result.blowup_step ? nlohmann::json(*result.blowup_step) : nullptr},
      {"blowup_lr", result.blowup_step ? nlohmann::json(result.blowup_lr) : nullptr},
      {"blowup_over_10", result.blowup_step ? nlohmann::json(result.blowup_lr / 10) : nullptr},
      {"steepest_lr", result.steepest_lr ? nlohmann::json(*result.steepest_lr) : nullptr},
      {"suggested_lr", result.suggested_lr},
      {"suggestion_rule", result.suggestion_rule},
      {"points", points},
  };
  return json.dump(2) + "\n";
}

int RunLrFind(Config config, const LrFindOptions& given) {
  LrFindOptions options = given;
  CheckLrFindOptions(options);
  const std::string run_dir = RunDirectory(config);
  if (options.out_dir.empty()) options.out_dir = run_dir + "-lr-find";
  if (IsInside(options.out_dir, run_dir))
    throw UsageError("--out " + options.out_dir + " is inside the run directory " + run_dir +
                     ": the LR finder writes nothing there");
  const Config original = config;  // what --apply copies, with only optimizer.lr changed
  // The sweep is the schedule; nothing is kept but the scratch run's config and metrics.
  config.Set("job.dump_folder", JoinPath(options.out_dir, "run"));
  config.Set("training.steps", options.steps);
  // A run in stages sweeps on its first stage's blend (a one-stage run is the plain blend of its
  // list, sample for sample); a blend of blends stays one stage of the sweep's steps.
  if (const std::vector<DataStage> stages = ReadDataStages(config); !stages.empty()) {
    std::vector<std::string> first_stage;
    if (stages.front().blends.empty()) {
      config.Set("training.dataset_path", stages.front().list);
    } else {
      std::string blends;
      for (const WeightedFileList& part : stages.front().blends)
        blends += (blends.empty() ? "" : ", ") + StrFormat("{ list = %s, weight = %s }",
                                                           FormatConfigValue(part.list).c_str(),
                                                           FormatDouble(part.weight).c_str());
      first_stage.push_back(
          StrFormat("{ blends = [%s], steps = %lld }", blends.c_str(), (long long)options.steps));
    }
    config.Set("data.stages", first_stage);
  }
  config.Set("checkpoint.enable", false);
  config.Set("validation.enable", false);
  config.Set("lr_scheduler.warmup_steps", int64_t{0});
  config.Set("lr_scheduler.decay_type", std::string("constant"));

  std::vector<LrSweepPoint> points;
  std::optional<int64_t> blowup_step;
  bool leader = false;
  {
    Trainer trainer(std::move(config), "none");
    leader = trainer.leader();
    trainer.SetLearningRate([&options](int64_t step) { return SweepLearningRate(options, step); });
    trainer.AddHook(std::make_unique<SweepHook>(options, leader, points, blowup_step));
    if (leader)
      PrintLine(StrFormat("phase=lr_find status=start min=%g max=%g steps=%lld out=%s",
                          options.min_lr, options.max_lr, (long long)options.steps,
                          options.out_dir.c_str()));
    try {
      if (const int exit_code = trainer.Run(); exit_code != kExitOk) return exit_code;
    } catch (const Error& e) {
      // Weights the update made non-finite: the blow-up, at the step the sweep had not recorded
      // yet (every rank throws there alike). (A non-finite loss reaches SweepHook: its update
      // was skipped.)
      if (e.exit_code() != kExitDiverged) throw;
      const int64_t step = points.empty() ? 1 : points.back().step + 1;
      points.push_back({step, SweepLearningRate(options, step), std::nan(""), std::nan("")});
      blowup_step = step;
      if (leader) LogWarn(std::string("the sweep diverged: ") + e.what());
      if (leader)
        PrintLine(StrFormat("phase=lr_find step=%lld/%lld lr=%.6g status=diverged", (long long)step,
                            (long long)options.steps, points.back().lr));
    }
  }
  if (!leader) return kExitOk;
  const LrFindResult result = AnalyzeSweep(std::move(points), blowup_step);
  PrintTable(result);
  const std::string json_path = JoinPath(options.out_dir, "lr_find.json");
  const std::string svg_path = JoinPath(options.out_dir, "lr_find.svg");
  AtomicWriteFile(json_path, LrFindJson(options, result));
  AtomicWriteFile(svg_path,
                  LrFindSvg(options, result,
                            StrFormat("LR finder: %s, %s", original.String("job.name").c_str(),
                                      original.String("optimizer.name").c_str())));
  const auto format_optional = [](std::optional<double> lr) {
    return lr ? StrFormat("%.6g", *lr) : std::string("none");
  };
  PrintLine(StrFormat(
      "phase=lr_find status=done steps_run=%zu steepest_lr=%s blowup_lr=%s suggested_lr=%.6g "
      "rule=%s json=%s svg=%s",
      result.points.size(), format_optional(result.steepest_lr).c_str(),
      format_optional(result.blowup_step ? std::optional(result.blowup_lr) : std::nullopt).c_str(),
      result.suggested_lr, result.suggestion_rule.c_str(), json_path.c_str(), svg_path.c_str()));
  if (!options.apply_path.empty()) {
    Config applied = original;
    applied.Set("optimizer.lr", result.suggested_lr);
    AtomicWriteFile(options.apply_path, applied.ToToml());
    PrintLine(StrFormat("phase=lr_find status=applied path=%s optimizer.lr=%.6g",
                        options.apply_path.c_str(), result.suggested_lr));
  }
  return kExitOk;
}

}  // namespace crucible
