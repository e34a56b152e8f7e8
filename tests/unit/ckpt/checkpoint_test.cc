// Checkpoint folders: write, verify, load, fall back, prune; the interval rule; the async writer.
#include "ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "ckpt/async_writer.h"
#include "ckpt/interval.h"
#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("ckpt_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    config_ = Config::Defaults();
    for (const char* o : {"model.vocab_size=64", "model.dim=16", "model.n_layers=1",
                          "model.n_heads=2", "model.n_kv_heads=1", "model.ffn_hidden_dim=32"})
      config_.ApplyOverride(o);
    model_ = BuildModelSpec(config_);
    table_ = std::make_unique<ParameterTable>(model_->BuildTable());
  }
  void TearDown() override { fs::remove_all(root_); }

  CheckpointSnapshot Snapshot(int64_t step) {
    CheckpointSnapshot s;
    s.step = step;
    s.weights.resize(table_->total());
    for (size_t i = 0; i < s.weights.size(); ++i)
      s.weights[i] = static_cast<float>(i) * 0.5f + step;
    s.optimizer_state = {{"exp_avg", std::vector<float>(table_->total(), 1.0f * step)},
                         {"exp_avg_sq", std::vector<float>(table_->total(), 2.0f * step)}};
    s.state = {{"step", step}, {"consumed_samples", step * 4}};
    s.config_toml = config_.ToToml();
    return s;
  }
  std::string Dir(int64_t step) { return (root_ / CheckpointDirName(step)).string(); }

  fs::path root_;
  Config config_;
  std::shared_ptr<const ModelSpec> model_;
  std::unique_ptr<ParameterTable> table_;
};

TEST_F(CheckpointTest, WrittenCheckpointVerifiesAndLoadsBack) {
  WriteCheckpoint(root_.string(), Snapshot(7), *table_, *model_);
  EXPECT_EQ(VerifyCheckpoint(Dir(7)), "");
  EXPECT_EQ(ReadFile((root_ / "latest").string()), "step-7\n");
  std::vector<float> weights(table_->total()), m(table_->total()), v(table_->total());
  nlohmann::json state =
      LoadCheckpoint(Dir(7), *table_, weights.data(), {{"exp_avg", &m}, {"exp_avg_sq", &v}}, 0);
  EXPECT_EQ(state["step"], 7);
  EXPECT_EQ(weights, Snapshot(7).weights);
  EXPECT_EQ(m[3], 7.0f);
  EXPECT_EQ(v[5], 14.0f);
  // No temporary folder is left behind.
  for (const auto& entry : fs::directory_iterator(root_))
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
}

// A per-tensor state (n floats for each parameter tensor, e.g. a per-matrix scalar) is stored as
// "<state>.<parameter name>" of shape {n}, beside the per-element ones, and loads back.
TEST_F(CheckpointTest, PerTensorOptimizerStateIsStoredUnderEachParameterName) {
  CheckpointSnapshot snapshot = Snapshot(4);
  const size_t tensors = table_->params().size();
  std::vector<float> pairs(2 * tensors);
  for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = 0.25f * static_cast<float>(i);
  snapshot.optimizer_state.push_back({"scale", pairs, 2});
  WriteCheckpoint(root_.string(), snapshot, *table_, *model_);
  SafetensorsReader file(Dir(4) + "/optimizer.safetensors");
  const ParamInfo& last = table_->params().back();
  float stored[2];
  file.ReadFloat32("scale." + last.name, {2}, stored);
  EXPECT_EQ(stored[0], pairs[2 * (tensors - 1)]);
  EXPECT_EQ(stored[1], pairs[2 * (tensors - 1) + 1]);
  ASSERT_NE(file.Find("exp_avg." + last.name), nullptr);  // the per-element ones as before
  std::vector<float> weights(table_->total()), m(table_->total()), v(table_->total()),
      loaded(2 * tensors);
  LoadCheckpoint(Dir(4), *table_, weights.data(),
                 {{"exp_avg", &m}, {"exp_avg_sq", &v}, {"scale", &loaded, 2}}, 0);
  EXPECT_EQ(loaded, pairs);
  EXPECT_EQ(m[3], 4.0f);
}

// Written so (NaN in the state itself, MANIFEST and COMPLETE consistent), a checkpoint verifies:
// the load must look at the values, as a model load does, and name one from before it.
TEST_F(CheckpointTest,
       ANonFiniteOptimizerStateOrWeightIsRefusedNamingTheTensorAndAnEarlierCheckpoint) {
  WriteCheckpoint(root_.string(), Snapshot(4), *table_, *model_);
  CheckpointSnapshot poisoned = Snapshot(7);
  const ParamInfo& last = table_->params().back();
  poisoned.optimizer_state[1].values[last.offset + 3] = std::nanf("");
  poisoned.optimizer_state[1].values[last.offset + 5] = INFINITY;
  WriteCheckpoint(root_.string(), poisoned, *table_, *model_);
  ASSERT_EQ(VerifyCheckpoint(Dir(7)), "");
  std::vector<float> weights(table_->total()), m(table_->total()), v(table_->total());
  auto load_error = [&](int64_t step) -> std::string {
    try {
      LoadCheckpoint(Dir(step), *table_, weights.data(), {{"exp_avg", &m}, {"exp_avg_sq", &v}}, 0);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitBadData);
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      return e.what();
    }
    return "";
  };
  std::string what = load_error(7);
  EXPECT_NE(what.find(Dir(7) + "/optimizer.safetensors: tensor 'exp_avg_sq." + last.name +
                      "' holds 2 non-finite values"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("roll back to " + Dir(4) + " (--resume " + Dir(4) + ")"), std::string::npos)
      << what;
  EXPECT_EQ(load_error(4), "");
  // A weight too, and with no checkpoint before it the advice says so.
  CheckpointSnapshot bad_weight = Snapshot(2);
  bad_weight.weights[table_->params()[0].offset] = -INFINITY;
  WriteCheckpoint(root_.string(), bad_weight, *table_, *model_);
  what = load_error(2);
  EXPECT_NE(what.find(Dir(2) + "/model.safetensors: tensor '" + table_->params()[0].name +
                      "' holds 1 non-finite value"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("no checkpoint from before it"), std::string::npos) << what;
}

TEST_F(CheckpointTest, VerifyNamesTheDamagedFile) {
  WriteCheckpoint(root_.string(), Snapshot(1), *table_, *model_);
  const std::string model = Dir(1) + "/model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 4);
  EXPECT_NE(VerifyCheckpoint(Dir(1)).find("model.safetensors: "), std::string::npos);

  WriteCheckpoint(root_.string(), Snapshot(2), *table_, *model_);
  {
    std::fstream f(Dir(2) + "/optimizer.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  EXPECT_NE(VerifyCheckpoint(Dir(2)).find("optimizer.safetensors: checksum"), std::string::npos);

  WriteCheckpoint(root_.string(), Snapshot(3), *table_, *model_);
  { std::ofstream(Dir(3) + "/MANIFEST", std::ios::app) << "# edited\n"; }
  EXPECT_NE(VerifyCheckpoint(Dir(3)).find("MANIFEST: checksum"), std::string::npos);

  WriteCheckpoint(root_.string(), Snapshot(4), *table_, *model_);
  fs::remove(Dir(4) + "/COMPLETE");
  EXPECT_NE(VerifyCheckpoint(Dir(4)).find("COMPLETE is missing"), std::string::npos);
}

TEST_F(CheckpointTest, SizesOnlyVerificationChecksEverythingButTheContent) {
  WriteCheckpoint(root_.string(), Snapshot(1), *table_, *model_);
  EXPECT_EQ(VerifyCheckpoint(Dir(1), VerifyDepth::kSizes), "");
  {  // a flipped byte: same size, only a checksum sees it
    std::fstream f(Dir(1) + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300);
    f.put('\x7f');
  }
  EXPECT_EQ(VerifyCheckpoint(Dir(1), VerifyDepth::kSizes), "");
  EXPECT_NE(VerifyCheckpoint(Dir(1)).find("model.safetensors: checksum"), std::string::npos);
  const std::string model = Dir(1) + "/model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 4);
  EXPECT_NE(VerifyCheckpoint(Dir(1), VerifyDepth::kSizes).find("model.safetensors: "),
            std::string::npos);
  WriteCheckpoint(root_.string(), Snapshot(2), *table_, *model_);
  { std::ofstream(Dir(2) + "/MANIFEST", std::ios::app) << "# edited\n"; }
  EXPECT_NE(VerifyCheckpoint(Dir(2), VerifyDepth::kSizes).find("MANIFEST: checksum"),
            std::string::npos);
  fs::remove(Dir(2) + "/COMPLETE");
  EXPECT_NE(VerifyCheckpoint(Dir(2), VerifyDepth::kSizes).find("COMPLETE is missing"),
            std::string::npos);
}

TEST_F(CheckpointTest, ResumeFallsBackToTheNewestGoodOneAndReportsWhy) {
  for (int64_t step : {10, 20, 30})
    WriteCheckpoint(root_.string(), Snapshot(step), *table_, *model_);
  fs::remove(Dir(30) + "/state.json");
  fs::remove(root_ / "latest");
  std::vector<std::string> reports;
  auto found =
      FindResumeCheckpoint(root_.string(), [&](const std::string& r) { reports.push_back(r); });
  ASSERT_TRUE(found);
  EXPECT_EQ(*found, Dir(20));
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_NE(reports[0].find("latest is missing"), std::string::npos);
  EXPECT_NE(reports[1].find("step-30 is unusable: state.json: missing"), std::string::npos);
  EXPECT_TRUE(fs::exists(Dir(30)));  // evidence kept

  fs::remove(Dir(20) + "/COMPLETE");
  fs::remove(Dir(10) + "/COMPLETE");
  try {
    FindResumeCheckpoint(root_.string(), [](const std::string&) {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("none of the 3 checkpoints verifies"), std::string::npos);
  }
  EXPECT_FALSE(FindResumeCheckpoint((root_ / "absent").string(), [](const std::string&) {}));
}

TEST_F(CheckpointTest, RunWeightsFallBackToTheFinalModelNamingEachCheckpointSkipped) {
  // A run directory: config.toml, ckpt/ with two damaged checkpoints, the final model.
  const fs::path run = root_ / "run";
  const std::string ckpt = (run / "ckpt").string();
  for (int64_t step : {10, 20}) WriteCheckpoint(ckpt, Snapshot(step), *table_, *model_);
  AtomicWriteFile((run / "config.toml").string(), config_.ToToml());
  fs::remove(ckpt + "/step-20/COMPLETE");
  fs::resize_file(ckpt + "/step-10/state.json", 3);
  AtomicWriteFile((run / "model.safetensors").string(), "final");
  std::vector<std::string> reports;
  RunWeights found =
      FindRunWeights(run.string(), "evaluate", [&](const std::string& r) { reports.push_back(r); });
  EXPECT_EQ(found.weights_path, (run / "model.safetensors").string());
  EXPECT_EQ(found.config_path, (run / "config.toml").string());
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0], "checkpoint " + ckpt + "/step-20 is unusable: COMPLETE is missing (the " +
                            "save never finished); skipped");
  EXPECT_NE(reports[1].find(ckpt + "/step-10 is unusable: state.json: 3 bytes"), std::string::npos)
      << reports[1];
  EXPECT_EQ(reports[2], run.string() + ": none of the 2 checkpoints under " + ckpt +
                            " verifies (skipped: step-20, step-10); using the run's final model " +
                            (run / "model.safetensors").string());

  // Nothing usable: an error for the command, not the trainer's advice; nothing deleted.
  fs::remove(run / "model.safetensors");
  try {
    FindRunWeights(run.string(), "export", [](const std::string&) {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    const std::string message = e.what();
    EXPECT_EQ(message.find(run.string() + ": nothing to export: none of the 2 checkpoints under " +
                           ckpt + " verifies (newest: "),
              0u)
        << message;
    EXPECT_NE(message.find("no final model.safetensors"), std::string::npos) << message;
    EXPECT_EQ(message.find("--resume"), std::string::npos) << message;
  }
  EXPECT_TRUE(fs::exists(ckpt + "/step-20") && fs::exists(ckpt + "/step-10"));

  // A good checkpoint is preferred, with nothing to report when `latest` names it.
  WriteCheckpoint(ckpt, Snapshot(30), *table_, *model_);
  reports.clear();
  found =
      FindRunWeights(run.string(), "export", [&](const std::string& r) { reports.push_back(r); });
  EXPECT_EQ(found.weights_path, ckpt + "/step-30/model.safetensors");
  EXPECT_EQ(found.config_path, ckpt + "/step-30/config.toml");
  EXPECT_TRUE(reports.empty());
}

// A process that sleeps until killed: a writer that is alive, then one that is gone.
pid_t StartSleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  return pid;
}

void Reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

// A WRITER record with one field's value replaced.
std::string WithField(const std::string& record, const std::string& key, const std::string& value) {
  std::string out;
  for (const std::string& line : Split(record, '\n'))
    if (!line.empty()) out += (line.rfind(key + "=", 0) == 0 ? key + "=" + value : line) + "\n";
  return out;
}

// A temporary folder as a save that stopped part way leaves it: a partial weights file and,
// unless `record` is empty, the writer record.
std::string MakeTemporary(const fs::path& root, const std::string& name,
                          const std::string& record) {
  const fs::path dir = root / name;
  fs::create_directories(dir);
  std::ofstream(dir / "model.safetensors") << std::string(1 << 16, 'w');
  if (!record.empty()) std::ofstream(dir / "WRITER") << record;
  return dir.string();
}

TEST_F(CheckpointTest, ATemporaryFolderWhoseWriterIsGoneIsRemovedAtTheNextSave) {
  fs::create_directories(root_);
  // Its writer was killed (and reaped): this host, no such process now.
  const pid_t dead = StartSleeper();
  const std::string dead_record = CheckpointWriterRecord(dead);
  ASSERT_NE(dead_record.find("pid=" + std::to_string(dead) + "\n"), std::string::npos);
  Reap(dead);
  const std::string gone =
      MakeTemporary(root_, ".tmp-step-40." + std::to_string(dead), dead_record);
  // Its record names a pid that now runs another process (another start time).
  const pid_t reused = StartSleeper();
  const std::string reused_record = WithField(CheckpointWriterRecord(reused), "start_time", "1");
  const std::string stale = MakeTemporary(root_, ".tmp-step-30.77", reused_record);

  WriteCheckpoint(root_.string(), Snapshot(50), *table_, *model_);
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(VerifyCheckpoint(Dir(50)), "");
  EXPECT_FALSE(fs::exists(Dir(50) + "/WRITER")) << "the record is not part of a checkpoint";
  Reap(reused);
}

TEST_F(CheckpointTest, ATemporaryFolderWhoseWriterMayBeAliveIsKept) {
  fs::create_directories(root_);
  const pid_t alive = StartSleeper();
  const std::string record = CheckpointWriterRecord(alive);
  const std::string live = MakeTemporary(root_, ".tmp-step-40." + std::to_string(alive), record);
  // Another host (or this host's name in another pid namespace or boot): cannot be checked.
  const std::string elsewhere =
      MakeTemporary(root_, ".tmp-step-41.5", WithField(record, "host", "some-other-node"));
  const std::string other_namespace =
      MakeTemporary(root_, ".tmp-step-42.6", WithField(record, "pid_namespace", "pid:[1]"));
  // No record at all: a save from before records existed, or one that has just begun.
  const std::string unrecorded = MakeTemporary(root_, ".tmp-step-43.7", "");

  WriteCheckpoint(root_.string(), Snapshot(50), *table_, *model_);
  for (const auto& dir : {live, elsewhere, other_namespace, unrecorded})
    EXPECT_TRUE(fs::exists(dir + "/model.safetensors")) << dir;
  Reap(alive);
  // Now that writer is gone too.
  WriteCheckpoint(root_.string(), Snapshot(60), *table_, *model_);
  EXPECT_FALSE(fs::exists(live));
  EXPECT_TRUE(fs::exists(elsewhere) && fs::exists(other_namespace) && fs::exists(unrecorded));
}

TEST_F(CheckpointTest, PruneKeepsLatestKEveryNAndIncompleteFolders) {
  for (int64_t step = 5; step <= 40; step += 5)
    WriteCheckpoint(root_.string(), Snapshot(step), *table_, *model_);
  fs::remove(Dir(5) + "/COMPLETE");  // incomplete: never deleted
  auto removed = PruneCheckpoints(root_.string(), 2, 20);
  EXPECT_EQ(removed.size(), 4u);  // 10, 15, 25, 30
  std::vector<int64_t> kept;
  for (const auto& [step, dir] : ListCheckpoints(root_.string())) kept.push_back(step);
  EXPECT_EQ(kept, (std::vector<int64_t>{40, 35, 20, 5}));
  EXPECT_TRUE(PruneCheckpoints(root_.string(), 0, 0).empty());  // 0 keeps all
}

TEST_F(CheckpointTest, SavingAStepAgainMovesTheOldFolderAside) {
  WriteCheckpoint(root_.string(), Snapshot(3), *table_, *model_);
  fs::remove(Dir(3) + "/COMPLETE");
  WriteCheckpoint(root_.string(), Snapshot(3), *table_, *model_);
  EXPECT_EQ(VerifyCheckpoint(Dir(3)), "");
  EXPECT_TRUE(fs::exists(root_ / "step-3.replaced-1" / "model.safetensors"));
}

TEST_F(CheckpointTest, WriteFailureIsAnIoErrorAndLeavesNoFolder) {
  WriteCheckpoint(root_.string(), Snapshot(1), *table_, *model_);
  // A plain file where the temporary folder's parent should be.
  const std::string blocked = (root_ / "blocked").string();
  { std::ofstream(blocked) << "x"; }
  try {
    WriteCheckpoint(blocked + "/ckpt", Snapshot(2), *table_, *model_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitIo);
  }
  EXPECT_EQ(VerifyCheckpoint(Dir(1)), "");
  EXPECT_EQ(ReadFile((root_ / "latest").string()), "step-1\n");
}

TEST_F(CheckpointTest, ConfigChangesAreSplitIntoBreakingAndHarmless) {
  Config changed = config_;
  changed.ApplyOverride("training.seq_len=512");
  changed.ApplyOverride("training.steps=7");
  ConfigChanges changes = CompareResumeConfigs(config_, changed);
  ASSERT_EQ(changes.breaking.size(), 1u);
  EXPECT_EQ(changes.breaking[0], "training.seq_len: 256 -> 512");
  ASSERT_EQ(changes.harmless.size(), 1u);
  EXPECT_EQ(changes.harmless[0], "training.steps: 100 -> 7");
}

// A checkpoint written on the GPU resumes on the CPU and back: the files do not depend on the
// device, so changing it is harmless (scripts/gpu-check.sh resumes across devices on a GPU).
TEST_F(CheckpointTest, ChangingTheDeviceOnResumeIsHarmless) {
  Config on_gpu = config_;
  on_gpu.ApplyOverride("training.device=cuda");
  for (const auto& [saved, current] : {std::pair{on_gpu, config_}, std::pair{config_, on_gpu}}) {
    ConfigChanges changes = CompareResumeConfigs(saved, current);
    EXPECT_TRUE(changes.breaking.empty()) << changes.breaking[0];
    ASSERT_EQ(changes.harmless.size(), 1u);
    EXPECT_NE(changes.harmless[0].find("training.device"), std::string::npos);
  }
}

TEST(IntervalTest, YoungDalyAndMtbfFromAttempts) {
  EXPECT_DOUBLE_EQ(YoungDalyIntervalSeconds(2.0, 3600.0), std::sqrt(2.0 * 2.0 * 3600.0));
  EXPECT_NEAR(ExpectedLostFraction(2.0, 120.0, 3600.0), 2.0 / 120 + 122.0 / 7200, 1e-12);
  EXPECT_EQ(IntervalSteps(10.0, 0.3), 33);
  EXPECT_EQ(IntervalSteps(0.01, 1.0), 1);

  const std::string path =
      fs::temp_directory_path() / ("attempts_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(path);
    out << R"({"attempt":1,"wall_s":3600,"exit_code":137})"
        << "\n"
        << "not json\n"
        << R"({"attempt":2,"start":100,"end":7300,"exit_code":143})"
        << "\n"
        << R"({"attempt":3,"duration_s":1800,"rc":1})"
        << "\n"
        // Stops and errors that a retry cannot cure are not failures of the machine.
        << R"({"attempt":4,"wall_s":60,"exit_code":75})"
        << "\n"
        << R"({"attempt":5,"wall_s":60,"exit_code":2})"
        << "\n"
        << R"({"attempt":6,"wall_s":60,"exit_code":3})"
        << "\n"
        << R"({"attempt":7,"wall_s":60,"exit_code":65})"
        << "\n";
  }
  MtbfEstimate estimate = EstimateMtbf(path, 0);
  EXPECT_EQ(estimate.source, "attempts.jsonl");
  EXPECT_EQ(estimate.failures, 2);
  EXPECT_DOUBLE_EQ(estimate.seconds, (3600.0 + 7200.0 + 1800.0 + 4 * 60.0) / 2);
  fs::remove(path);
  EXPECT_EQ(EstimateMtbf(path, 5.0).source, "checkpoint.mtbf_hours");
  EXPECT_DOUBLE_EQ(EstimateMtbf(path, 5.0).seconds, 18000.0);
  EXPECT_EQ(EstimateMtbf(path, 0).source, "default");
}

TEST(AsyncWriterTest, RunsInTheBackgroundAndRethrowsErrors) {
  AsyncWriter writer;
  std::atomic<bool> release{false};
  writer.Start([&]() {
    while (!release) std::this_thread::yield();
  });
  EXPECT_TRUE(writer.Busy());
  writer.Rethrow();  // does not block on a running job
  release = true;
  writer.Wait();
  EXPECT_FALSE(writer.Busy());
  writer.Start([]() { throw IoError("disk full"); });
  try {
    writer.Wait();
    FAIL() << "expected the job's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitIo);
  }
  writer.Wait();  // the error is reported once
}

}  // namespace
}  // namespace crucible
