// What `crucible report` reads from one run directory, as series ready to chart. Every source is
// optional; a missing one leaves its part empty (the page then says "no data"):
//   metrics.jsonl              loss, lr, grad_norm / grad_norm_clipped, tok_per_s, mfu per step
//                              (train/metrics_log.h); for a `crucible grpo` run also its reward,
//                              KL, entropy, completion length and step-time split (rl/)
//   eval/validation.jsonl      held-out loss and task accuracy (± standard error) per step
//                              (train/validation.h)
//   eval/stages.jsonl          the evaluations at stage boundaries (train/stage_eval.h)
//   eval/*.json                `crucible eval --json` results (cli/eval.cc): accuracy per task
//   checkpoints.jsonl          one record per save with the training loop's stall
//                              (train/checkpointing.cc); without it, the phase=checkpoint lines of
//                              launch/attempt-<k>.log
//   launch/attempt-<k>.log     the trainer's phase=memory_check / memory / memory_peak lines
//   launch/attempts.jsonl      one record per attempt (launch/launcher.cc; docs/launch.md)
//   config.toml                the resolved config, for a summary
// A JSON line that does not parse is a DataError naming the file and line, except a last line
// without its newline: a live run is still writing it, and it is left out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace crucible {

// One line of a chart: y (and its standard error, where known) at each x. A NaN y is a step
// without that value (the trainer wrote null); it stays a point, drawn as a gap.
struct Series {
  std::vector<double> x, y, error;  // error: empty, or one per point
  void Add(double at, double value) {
    x.push_back(at);
    y.push_back(value);
  }
  size_t size() const { return x.size(); }
  bool HasValues() const;  // some y is finite
};

struct EvalScore {
  std::string task;
  int64_t items = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0, chance = 0;
};

// The scores of one evaluation: a `crucible eval --json` file, or the last validation record.
struct EvalSet {
  std::string source;  // "eval/final.json", "validation step 20"
  std::vector<EvalScore> scores;
};

// One line of eval/stages.jsonl (train/stage_eval.h): the evaluation at a stage boundary.
struct StageEvalRecord {
  int boundary = 0;
  std::string stage, next_stage;  // "" before the first / after the last
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> bits_per_byte;  // text name, bits per byte
  std::vector<EvalScore> tasks;
  std::string gate;  // "", "passed", or "stopped: <task> after <stage>"
};

// One record of launch/attempts.jsonl (kind "attempt"), placed on the run's time line.
struct LaunchAttempt {
  int attempt = 0;
  std::string started;         // local time, to the second, as the launcher wrote it
  double start_seconds = 0;    // since the first attempt started
  double wall_seconds = 0;     // how long it ran
  double downtime_before = 0;  // since the previous attempt ended (0 for the first)
  int exit_code = 0;
  std::string verdict, action, detail, evidence, blamed_node;
  std::vector<std::string> nodes;
  int64_t first_step = -1, last_step = -1;  // -1: it reached no step
  double backoff_seconds = 0;
};

// The per-step metrics of a `crucible grpo` run (docs/post-training.md, GRPO metrics): a point
// per metrics.jsonl record that has reward_mean (NaN where it lacks or nulls the field); empty
// for any other run.
struct GrpoSeries {
  Series reward_mean, accuracy;  // accuracy: built-in tasks only
  Series kl, entropy;            // nats per completion token
  Series completion_length;      // mean tokens per completion
  Series truncated_rate;         // share of completions that hit max_new_tokens
  // The step's seconds: sampling, rewards, the scoring passes, forward + backward + update.
  Series generation_seconds, reward_seconds, score_seconds, train_seconds;
};

struct RunData {
  std::string dir;   // as given
  std::string name;  // its folder name (made unique across the report by the caller)
  std::vector<std::pair<std::string, std::string>> config;  // key, value (config.toml)
  std::vector<std::string> notes;  // sources that were present but not usable, and why

  int64_t metrics_lines = 0;  // records of metrics.jsonl
  Series loss, lr, grad_norm, grad_norm_clipped, tokens_per_second, mfu;
  Series rss_peak_mib;  // rank 0's peak resident memory so far (rss_peak_bytes), in MiB
  bool grpo = false;    // some metrics.jsonl record has reward_mean: a `crucible grpo` run
  GrpoSeries grpo_metrics;

  Series held_out_loss;                               // eval/validation.jsonl
  std::map<std::string, Series> validation_accuracy;  // task -> acc ± stderr per step
  std::vector<EvalSet> evals;                         // eval/*.json, then the last validation
  std::vector<StageEvalRecord> stage_evals;           // eval/stages.jsonl

  Series checkpoint_stall;        // stall_s per saved step
  std::string checkpoint_source;  // "checkpoints.jsonl", "launch/attempt-<k>.log" or ""

  // Memory figures in bytes, in a fixed order ("activations (plan)", ..., "peak RSS (largest
  // rank)"), from the last attempt log that has them.
  std::vector<std::pair<std::string, double>> memory;
  std::string memory_source;

  std::vector<LaunchAttempt> attempts;
};

// Reads the run directory `dir`. UsageError when it is not a directory or has none of
// metrics.jsonl, eval/ and launch/; DataError for a malformed record (file and line named).
RunData LoadRun(const std::string& dir);

// Seconds since 1970 of the launcher's "YYYY-MM-DDTHH:MM:SS" (read as UTC: only differences
// matter); NaN when it is not that.
double ParseLaunchTime(const std::string& text);

}  // namespace crucible
