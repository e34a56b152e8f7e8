// What the unit tests that train through the real Trainer share: a scratch folder per test, the
// config of a tiny Llama, and what a run leaves in its folder. Header only (tests/unit/support/
// builds no test binary of its own).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/model_weights.h"
#include "common/config.h"
#include "model/model.h"

namespace crucible::test_support {

// A fresh folder under the temp directory, unique to this process and test ("<prefix>-<pid>-
// <test name>"); removed by the caller (RemoveAll in TearDown).
inline std::filesystem::path FreshTestFolder(const std::string& prefix) {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() /
      (prefix + "-" + std::to_string(::getpid()) + "-" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

// A tiny Llama (vocab 64, dim 16, two layers, 2 x 1 heads) on micro-batches of 2 x 16 tokens,
// global batch 4, `steps` steps, writing its run directory to `run_dir`; synthetic data unless
// the test sets [training] dataset.
inline Config TinyTrainingConfig(const std::filesystem::path& run_dir, int64_t steps) {
  Config config = Config::Defaults();
  for (const char* o :
       {"model.vocab_size=64", "model.dim=16", "model.n_layers=2", "model.n_heads=2",
        "model.n_kv_heads=1", "model.ffn_hidden_dim=32", "training.seq_len=16",
        "training.local_batch_size=2", "training.global_batch_size=4",
        "lr_scheduler.warmup_steps=1", "metrics.peak_gflops=100"})
    config.ApplyOverride(o);
  config.ApplyOverride("training.steps=" + std::to_string(steps));
  config.ApplyOverride("job.dump_folder=\"" + run_dir.string() + "\"");
  return config;
}

// The loss of every step in run_dir/metrics.jsonl.
inline std::vector<double> LoggedLosses(const std::filesystem::path& run_dir) {
  std::vector<double> losses;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return losses;
}

// run_dir/model.safetensors, read with the table of `config`'s model.
inline std::vector<float> FinalWeights(Config config, const std::filesystem::path& run_dir) {
  const ParameterTable table = BuildModelSpec(config)->BuildTable();
  std::vector<float> weights(table.total());
  LoadModelWeights((run_dir / "model.safetensors").string(), table, weights.data());
  return weights;
}

}  // namespace crucible::test_support
