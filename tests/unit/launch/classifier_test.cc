// The classifier on real log excerpts, one test per verdict (docs/launch.md, "Failover").
#include "launch/classifier.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

const std::vector<std::string> kActive = {"n1", "n2", "n3"};

// Feeds an excerpt through the same path the supervisor uses: RankLines, then the log.
struct Excerpt {
  explicit Excerpt(const std::string& text, LabelStyle labels = LabelStyle::kColon,
                   std::vector<std::string> active = kActive)
      : patterns(BadNodePatterns::Defaults()), log(&patterns, std::move(active)) {
    double t = 0;
    RankLines ranks(labels);
    for (const std::string& raw : Split(text, '\n'))
      if (!raw.empty())
        for (const OutputLine& line : ranks.Add(raw)) log.Add(line, t += 0.1);
  }
  Classification Classify(int exit_code, std::optional<double> time_left = std::nullopt,
                          bool previous_reached_step = true, int stop_signal = 0) {
    AttemptFacts facts;
    facts.stop_signal = stop_signal;
    facts.exit_code = exit_code;
    facts.timed_out = exit_code == 124;
    facts.log = &log;
    facts.time_left_seconds = time_left;
    facts.previous_reached_step = previous_reached_step;
    return ClassifyAttempt(facts);
  }
  BadNodePatterns patterns;
  AttemptLog log;
};

const char kRanks[] =
    "0: crucible-rank: rank=0 local_rank=0 world=3 node=n1 pid=100\n"
    "1: crucible-rank: rank=1 local_rank=0 world=3 node=n2 pid=200\n"
    "2: crucible-rank: rank=2 local_rank=0 world=3 node=n3 pid=300\n";

TEST(Classifier, Success) {
  Excerpt e(std::string(kRanks) + "0: step=1 loss=10.4\n0: done steps=1\n");
  EXPECT_EQ(e.Classify(0).verdict, Verdict::kSuccess);
}

TEST(Classifier, UsageExitIsConfigError) {
  Excerpt e(std::string(kRanks) +
            "0: crucible: error: training.seq_len: must be at least 1 (see crucible --help)\n");
  Classification c = e.Classify(2);
  EXPECT_EQ(c.verdict, Verdict::kConfigError);
  EXPECT_NE(c.evidence.find("training.seq_len"), std::string::npos);
  EXPECT_EQ(e.Classify(65).verdict, Verdict::kConfigError);
}

TEST(Classifier, TwoAttemptsWithoutAStepIsConfigError) {
  Excerpt e(std::string(kRanks) +
            "0: Traceback (most recent call last):\n0: ImportError: no module named trainer\n");
  EXPECT_EQ(e.Classify(1, std::nullopt, /*previous_reached_step=*/true).verdict,
            Verdict::kNoProgress);
  Classification c = e.Classify(1, std::nullopt, /*previous_reached_step=*/false);
  EXPECT_EQ(c.verdict, Verdict::kConfigError);
  EXPECT_NE(c.evidence.find("ImportError"), std::string::npos);
}

TEST(Classifier, ExitSeventyFourIsDiskIoWithNoNodeBlamed) {
  Excerpt e(std::string(kRanks) +
            "0: step=40 loss=6.1\n0: phase=checkpoint step=40 mode=async\n"
            "0: crucible: error: cannot write /scratch/run/ckpt/step-40/model.safetensors: No "
            "space left on device\n");
  Classification c = e.Classify(74);
  EXPECT_EQ(c.verdict, Verdict::kDiskIo);
  EXPECT_TRUE(c.node.empty());
}

const char kSlurmTimeLimit[] =
    "0: step=118 loss=4.2\n"
    "srun: Job step aborted: Waiting up to 12 seconds for job step to finish.\n"
    "0: slurmstepd-n1: error: *** STEP 3.0 ON n1 CANCELLED AT 2026-11-29T10:35:39 DUE TO TIME "
    "LIMIT ***\n"
    "slurmstepd-n1: error: *** JOB 3 ON n1 CANCELLED AT 2026-11-29T10:35:39 DUE TO TIME LIMIT ***\n"
    "srun: error: n1: task 0: Exited with exit code 143\n";

TEST(Classifier, SlurmTimeLimitIsWalltime) {
  Excerpt e(std::string(kRanks) + kSlurmTimeLimit);
  Classification c = e.Classify(143, 0.0);
  EXPECT_EQ(c.verdict, Verdict::kWalltime);
  EXPECT_NE(c.evidence.find("DUE TO TIME LIMIT"), std::string::npos);
}

TEST(Classifier, PbsWalltimeExitWithLittleTimeLeft) {
  Excerpt e("step=900 loss=3.0\n=>> PBS: job killed: walltime 3630 exceeded limit 3600\n",
            LabelStyle::kNone, {"x1000c0s0b0n0"});
  EXPECT_EQ(e.Classify(271).verdict, Verdict::kWalltime);
  Excerpt quiet("step=900 loss=3.0\n", LabelStyle::kNone, {"x1000c0s0b0n0"});
  EXPECT_EQ(quiet.Classify(-29, 20.0).verdict, Verdict::kWalltime);
}

// Real srun output after one rank was SIGKILLed: srun exits 143 because it terminated the rest.
const char kSrunRankKilled[] =
    "1: step=7 loss=5.0\n"
    "srun: error: n2: task 1: Killed\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=2.0\n"
    "0: slurmstepd-n1: error: *** STEP 2.0 ON n1 CANCELLED AT 2026-11-29T10:34:16 ***\n"
    "srun: error: n1: task 0: Terminated\n"
    "srun: error: n3: task 2: Terminated\n"
    "srun: Force Terminated StepId=2.0\n";

TEST(Classifier, A143WithHoursLeftIsNotWalltime) {
  Excerpt e(std::string(kRanks) + kSrunRankKilled);
  Classification c = e.Classify(143, 3 * 3600.0);
  EXPECT_EQ(c.verdict, Verdict::kBadNode);
  EXPECT_EQ(c.node, "n2");  // not n1 or n3, which srun terminated afterwards
  EXPECT_EQ(c.pattern, "slurm-task");
  EXPECT_EQ(c.evidence, "srun: error: n2: task 1: Killed");
}

struct NamedCase {
  const char* name;
  std::string log;
  LabelStyle labels;
  const char* node;
  const char* pattern;
};

TEST(Classifier, BadNodeNamedByEachFamilyOfMessages) {
  const std::vector<NamedCase> cases = {
      {"openmpi",
       "[1,0]<stdout>:step=3\nmpirun noticed that process rank 2 with PID 0 on node n3 exited on "
       "signal 9 (Killed).\n",
       LabelStyle::kTagged, "n3", "ompi-rank-signal"},
      {"openmpi-daemon",
       "ORTE has lost communication with a remote daemon.\n\n  HNP daemon   : [[47975,0],0] on "
       "node n1\n  Remote daemon: [[47975,0],2] on node n3\n",
       LabelStyle::kTagged, "n3", "ompi-lost-daemon"},
      {"mpich",
       "[0,0]<hydra>:step=3\n======================================================================"
       "============="
       "\n"
       "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   RANK 1 PID 4242 RUNNING AT "
       "n2\n=   KILLED BY SIGNAL: 9 (Killed)\n",
       LabelStyle::kTagged, "n2", "mpich-bad-term"},
      {"pals", "0: step=3\nN3.hsn.cm.example.com: rank 2 died from signal 9\n", LabelStyle::kColon,
       "n3", "pals-rank-died"},
      {"slurm-node-failure", "0: step=3\nsrun: error: Node failure on n2\n", LabelStyle::kColon,
       "n2", "slurm-node-fail"},
      {"nccl-ecc",
       "0: step=3\n1: n2:2895:2961 [0] NCCL WARN Cuda failure 'uncorrectable ECC error "
       "encountered'\n",
       LabelStyle::kColon, "n2", "nccl-hardware"},
      {"cuda-ecc-by-rank",
       "0: step=3\n2: RuntimeError: CUDA error: uncorrectable ECC error encountered\n",
       LabelStyle::kColon, "n3", "cuda-ecc"},
      {"xid",
       "0: step=3\n1: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n",
       LabelStyle::kColon, "n2", "cuda-fell-off"},
      {"slurm-oom",
       "0: step=3\n1: slurmstepd-n2: error: Detected 1 oom_kill event in StepId=12.0. Some of the "
       "step tasks have been OOM Killed.\n",
       LabelStyle::kColon, "n2", "slurm-oom"},
      {"kernel-oom",
       "0: step=3\n2: Out of memory: Killed process 3141 (crucible) total-vm:1000kB\n",
       LabelStyle::kColon, "n3", "oom-killer"},
  };
  for (const NamedCase& test : cases) {
    std::string ranks = kRanks;
    if (test.labels == LabelStyle::kTagged)
      ranks =
          "[1,0]<stderr>:crucible-rank: rank=0 local_rank=0 world=3 node=n1 pid=1\n"
          "[1,1]<stderr>:crucible-rank: rank=1 local_rank=0 world=3 node=n2 pid=2\n"
          "[1,2]<stderr>:crucible-rank: rank=2 local_rank=0 world=3 node=n3 pid=3\n";
    Excerpt e(ranks + test.log, test.labels);
    Classification c = e.Classify(1);
    EXPECT_EQ(c.verdict, Verdict::kBadNode) << test.name << ": " << c.evidence;
    EXPECT_EQ(c.node, test.node) << test.name;
    EXPECT_EQ(c.pattern, test.pattern) << test.name;
  }
}

TEST(Classifier, HostOutsideTheActiveNodesBlamesNobody) {
  Excerpt e(std::string(kRanks) + "0: step=3\nsrun: error: n9: task 4: Killed\n");
  EXPECT_EQ(e.Classify(1).verdict, Verdict::kUnknown);
}

TEST(Classifier, SchedulerNodeStateNamesTheNode) {
  Excerpt e(std::string(kRanks) + "0: step=3\n");
  AttemptFacts facts;
  facts.exit_code = 1;
  facts.log = &e.log;
  facts.node_states = {{"n1", "allocated"}, {"n3", "down*"}};
  Classification c = ClassifyAttempt(facts);
  EXPECT_EQ(c.verdict, Verdict::kBadNode);
  EXPECT_EQ(c.node, "n3");
  EXPECT_EQ(c.pattern, "scheduler-state");
}

TEST(Classifier, HangNamesTheNodeThatWentSilentFirst) {
  Excerpt e{std::string(kRanks)};
  // n2's rank stops talking at t=1; the others keep heartbeating until t=5.
  e.log.Add(ParseOutputLine("0: step=1", LabelStyle::kColon), 0.5);
  e.log.Add(ParseOutputLine("1: phase=heartbeat", LabelStyle::kColon), 1.0);
  e.log.Add(ParseOutputLine("2: phase=heartbeat", LabelStyle::kColon), 4.5);
  e.log.Add(ParseOutputLine("0: phase=heartbeat", LabelStyle::kColon), 5.0);
  Classification c = e.Classify(124);
  EXPECT_EQ(c.verdict, Verdict::kHang);
  EXPECT_EQ(c.node, "n2");
  EXPECT_EQ(c.pattern, "first-silent");
}

TEST(Classifier, HangWithoutAQuietestNodeBlamesNobody) {
  Excerpt e(std::string(kRanks) + "0: step=1\n0: step=2\n");  // only rank 0 ever spoke
  Classification c = e.Classify(124);
  EXPECT_EQ(c.verdict, Verdict::kHang);
  EXPECT_TRUE(c.node.empty());
}

TEST(Classifier, FirstAttemptWithoutAStepIsNoProgress) {
  Excerpt e(std::string(kRanks) + "0: phase=peak_flops status=measuring\n");
  EXPECT_EQ(e.Classify(1).verdict, Verdict::kNoProgress);
}

TEST(Classifier, AnythingElseIsUnknown) {
  Excerpt e(std::string(kRanks) + "0: step=5 loss=3.2\n0: Segmentation fault (core dumped)\n");
  Classification c = e.Classify(139);
  EXPECT_EQ(c.verdict, Verdict::kUnknown);
  EXPECT_NE(c.evidence.find("Segmentation fault"), std::string::npos);
  // A 143 with hours left and nothing that names a node is not walltime either.
  Excerpt stopped(std::string(kRanks) + "0: step=5 loss=3.2\n0: phase=stop signal=TERM\n");
  EXPECT_EQ(stopped.Classify(143, 7200.0).verdict, Verdict::kUnknown);
}

TEST(BadNodePatterns, SitesExtendWithoutRecompiling) {
  const std::string path = testing::TempDir() + "/site_patterns.txt";
  std::ofstream(path) << "# site\nsite-ib   mlx5_0: port (?<host>\\S+) link down\n";
  BadNodePatterns patterns = BadNodePatterns::Defaults();
  const size_t builtin = patterns.size();
  patterns.AddFile(path);
  EXPECT_EQ(patterns.size(), builtin + 1);
  auto match = patterns.Find("mlx5_0: port n7 link down");
  ASSERT_TRUE(match);
  EXPECT_EQ(match->pattern, "site-ib");
  EXPECT_EQ(match->host, "n7");
  EXPECT_FALSE(patterns.Find("step=3 loss=2.0"));
}

TEST(BadNodePatterns, InvalidRegexNamesFileAndLine) {
  const std::string path = testing::TempDir() + "/bad_patterns.txt";
  std::ofstream(path) << "# comment\nbroken   (unclosed\n";
  BadNodePatterns patterns;
  try {
    patterns.AddFile(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(patterns.AddText("name-only\n", "inline"), Error);
}

// The evidence is the line that says something, not an MPI launcher's banner. Real output of
// failing jobs (Open MPI 4.1.4 mpirun --tag-output, MPICH 4.0.2 Hydra -l), captured here.
const char kOpenMpiConfigError[] =
    "[1,0]<stderr>:crucible-rank: rank=0 local_rank=0 world=2 node=vm pid=17994\n"
    "[1,1]<stderr>:crucible-rank: rank=1 local_rank=1 world=2 node=vm pid=17995\n"
    "[1,0]<stderr>:crucible: error: --set data.no_such_key=1: unknown key 'data.no_such_key'\n"
    "--------------------------------------------------------------------------\n"
    "Primary job  terminated normally, but 1 process returned\n"
    "a non-zero exit code. Per user-direction, the job has been aborted.\n"
    "--------------------------------------------------------------------------\n"
    "[1,1]<stderr>:crucible: error: --set data.no_such_key=1: unknown key 'data.no_such_key'\n"
    "--------------------------------------------------------------------------\n"
    "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
    "the job to be terminated. The first process to do so was:\n"
    "\n"
    "  Process name: [[10939,1],0]\n"
    "  Exit code:    2\n"
    "--------------------------------------------------------------------------\n";

TEST(Evidence, OpenMpiBannersAreSkippedForTheErrorLine) {
  Excerpt e(kOpenMpiConfigError, LabelStyle::kTagged, {"vm"});
  Classification c = e.Classify(2);
  EXPECT_EQ(c.verdict, Verdict::kConfigError);
  EXPECT_EQ(c.evidence,
            "exit 2 (usage or config error): 0: crucible: error: --set data.no_such_key=1: "
            "unknown key 'data.no_such_key'");
}

TEST(Evidence, OpenMpiRankKilledNamesTheSignalNotTheSeparator) {
  Excerpt e(
      "[1,0]<stdout>:step=1\n"
      "[1,1]<stdout>:step=1\n"
      "--------------------------------------------------------------------------\n"
      "Primary job  terminated normally, but 1 process returned\n"
      "a non-zero exit code. Per user-direction, the job has been aborted.\n"
      "--------------------------------------------------------------------------\n"
      "--------------------------------------------------------------------------\n"
      "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n"
      "--------------------------------------------------------------------------\n",
      LabelStyle::kTagged, {"n1"});
  Classification c = e.Classify(137);
  EXPECT_EQ(c.verdict, Verdict::kUnknown);
  EXPECT_EQ(c.evidence,
            "exit 137: mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 "
            "(Killed).");
}

TEST(Evidence, HydraBoxIsSkipped) {
  Excerpt e(
      "[0,0]<hydra>:step=1\n"
      "[0,1]<hydra>:step=1\n"
      "\n"
      "==================================================================================="
      "\n"
      "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
      "=   PID 18248 RUNNING AT vm\n"
      "=   EXIT CODE: 9\n"
      "=   CLEANING UP REMAINING PROCESSES\n"
      "=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n"
      "==================================================================================="
      "\n"
      "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n"
      "This typically refers to a problem with your application.\n"
      "Please see the FAQ page for debugging suggestions\n",
      LabelStyle::kTagged, {"n1"});
  Classification c = e.Classify(9);
  EXPECT_EQ(c.evidence,
            "exit 9: YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)");
}

TEST(Evidence, TheFirstErrorLineWinsOverLaterCollateral) {
  Excerpt e(std::string(kRanks) +
            "0: step=4 loss=9.1\n"
            "1: crucible: error: cannot read data/shard-3.bin: Input/output error\n"
            "0: crucible: error: collective timeout at step 5: rank 1 did not answer\n"
            "--------------------------------------------------------------------------\n");
  Classification c = e.Classify(1);
  EXPECT_EQ(c.evidence,
            "exit 1: 1: crucible: error: cannot read data/shard-3.bin: Input/output error");
}

TEST(Evidence, WithoutAnErrorTheLastMeaningfulLine) {
  Excerpt e(std::string(kRanks) + "0: step=7 loss=8.5\n\n=====\n");
  EXPECT_EQ(e.Classify(1).evidence, "exit 1: 0: step=7 loss=8.5");
  Excerpt silent("");
  EXPECT_EQ(silent.Classify(1).evidence, "exit 1 before the first step= line: (no output)");
}

// What the launcher does next agrees with the verdict, in both modes.
TEST(NextStep, AConfigErrorIsNeverRetriedWhicheverMode) {
  Excerpt e(std::string(kRanks) + "0: fake_trainer: error: asked to exit 1\n");
  Classification c = e.Classify(1, std::nullopt, /*previous_reached_step=*/false);
  ASSERT_EQ(c.verdict, Verdict::kConfigError);
  for (bool auto_retry : {false, true}) {
    Decision d = DecideNextStep(c, {auto_retry, /*retries=*/3, /*retry=*/2, 0});
    EXPECT_EQ(d.step, NextStep::kStop) << "auto_retry=" << auto_retry;
  }
  Classification usage = e.Classify(2);
  EXPECT_EQ(DecideNextStep(usage, {false, 3, 1, 0}).step, NextStep::kStop);
}

TEST(Classifier, ExitThreeIsDivergedAndNeverRetriedOrBlamedOnANode) {
  // A resume replays the same bits, so a diverged run would diverge again on any node.
  Excerpt e(std::string(kRanks) + "0: step=1 loss=10.4\n" +
            "0: crucible: error: step 11: 10 updates skipped in a row since step 2 "
            "(training.max_consecutive_skips = 10): training stopped\n");
  Classification c = e.Classify(3);
  EXPECT_EQ(c.verdict, Verdict::kDiverged);
  EXPECT_STREQ(VerdictName(c.verdict), "diverged");
  EXPECT_EQ(c.node, "");
  EXPECT_NE(c.evidence.find("10 updates skipped in a row"), std::string::npos) << c.evidence;
  for (bool auto_retry : {false, true})
    EXPECT_EQ(DecideNextStep(c, {auto_retry, 3, 1, 0}).step, NextStep::kStop) << auto_retry;
}

TEST(NextStep, PlainRetriesRetryEveryOtherFailureUntilUsedUp) {
  Excerpt e(std::string(kRanks) + "0: step=1 loss=10.4\n0: Segmentation fault\n");
  Classification c = e.Classify(139);
  EXPECT_EQ(DecideNextStep(c, {false, 2, 1, 0}).step, NextStep::kRetry);
  EXPECT_EQ(DecideNextStep(c, {false, 2, 2, 0}).step, NextStep::kRetry);
  Decision last = DecideNextStep(c, {false, 2, 3, 0});
  EXPECT_EQ(last.step, NextStep::kStop);
  EXPECT_EQ(last.detail, "(retries used up)");
  EXPECT_EQ(DecideNextStep(c, {false, 0, 1, 0}).detail, "");  // no retries were asked for
  EXPECT_EQ(DecideNextStep(c, {true, 2, 1, 0}).step, NextStep::kFailover);
}

TEST(Classifier, AStopTheLauncherWasAskedForIsStoppedUnlessAtWalltime) {
  Excerpt e(std::string(kRanks) + "0: step=5 loss=9.0\n" +
            "0: stopped step=5 signal=SIGUSR1 checkpoint=/r/ckpt/step-5 exit=143\n");
  Classification c = e.Classify(143, 7200.0, true, 15);
  EXPECT_EQ(c.verdict, Verdict::kStopped);
  EXPECT_EQ(c.evidence,
            "exit 143 after signal 15 to the launcher: stopped step=5 signal=SIGUSR1 "
            "checkpoint=/r/ckpt/step-5 exit=143");
  EXPECT_EQ(e.Classify(75, 7200.0, true, 10).verdict, Verdict::kStopped);
  EXPECT_EQ(e.Classify(75, 60.0, true, 10).verdict, Verdict::kWalltime);
  EXPECT_EQ(e.Classify(143, 7200.0).verdict, Verdict::kUnknown);  // nobody asked the launcher
}

TEST(NextStep, AStopTheLauncherWasAskedForIsNotRetried) {
  Excerpt e(std::string(kRanks) + "0: step=5 loss=9.0\n");
  for (int code : {143, 75}) {
    Decision d = DecideNextStep(e.Classify(code, 7200.0, true, 15), {true, 10, 1, 15});
    EXPECT_EQ(d.step, NextStep::kStopAndResubmit) << code;
    EXPECT_EQ(d.detail, "(signalled)");
    // A signal that came after the attempt ended (during the backoff) stops the launch too.
    EXPECT_EQ(DecideNextStep(e.Classify(code, 7200.0), {true, 10, 1, 15}).step,
              NextStep::kStopAndResubmit);
  }
  EXPECT_EQ(DecideNextStep(e.Classify(0), {true, 10, 1, 15}).step, NextStep::kDone);
}

}  // namespace
}  // namespace crucible
