// The rewards of GRPO (rl/rewards.h): the built-in tasks' generators are pure functions of (seed,
// index) with the right answers; the answer format check; and the external reward command: a
// good command, and each documented failure (timeout, crash, signal, malformed line, too few and
// too many lines) as a one-line DataError naming the prompt where a line is at fault.
#include "rl/rewards.h"

#include <gtest/gtest.h>

#include <chrono>
#include <regex>

#include "common/error.h"

namespace crucible {
namespace {

TEST(RewardTasks, ProblemsArePureFunctionsOfSeedAndIndexWithTheRightAnswer) {
  for (RewardTask task : {RewardTask::kSumDigits, RewardTask::kAddition}) {
    for (std::uint64_t index = 0; index < 200; ++index) {
      const TaskProblem problem = MakeProblem(task, 42, index);
      const TaskProblem again = MakeProblem(task, 42, index);
      EXPECT_EQ(problem.prompt, again.prompt);
      EXPECT_EQ(problem.answer, again.answer);
      EXPECT_NE(problem.prompt.find("Finish with a line \"Answer: <integer>\"."),
                std::string::npos);
      std::smatch match;
      if (task == RewardTask::kSumDigits) {
        ASSERT_TRUE(std::regex_search(problem.prompt, match, std::regex("digits of ([0-9]+)\\?")));
        const std::string number = match[1];
        EXPECT_GE(number.size(), 2u);
        EXPECT_LE(number.size(), 8u);
        EXPECT_NE(number[0], '0');
        int sum = 0;
        for (char digit : number) sum += digit - '0';
        EXPECT_EQ(problem.answer, std::to_string(sum));
      } else {
        ASSERT_TRUE(std::regex_search(problem.prompt, match,
                                      std::regex("What is ([0-9]+) \\+ ([0-9]+)\\?")));
        EXPECT_EQ(problem.answer, std::to_string(std::stoull(match[1]) + std::stoull(match[2])));
      }
    }
    EXPECT_NE(MakeProblem(task, 42, 0).prompt, MakeProblem(task, 43, 0).prompt);
  }
  EXPECT_EQ(MakeProblem(RewardTask::kAddition, 1, 0).prompt,
            MakeProblem(RewardTask::kAddition, 1, 0).prompt);
  EXPECT_EQ(ParseRewardTask("sum_digits", "k"), RewardTask::kSumDigits);
  EXPECT_THROW(ParseRewardTask("multiply", "k"), Error);
}

TEST(RewardTasks, AnswerFormatAndCorrectness) {
  const auto check = [](const char* completion, const char* expected) {
    return CheckAnswer(completion, expected);
  };
  AnswerCheck result = check("4 + 8 + 2 = 14\nAnswer: 14", "14");
  EXPECT_TRUE(result.format_ok && result.correct);
  EXPECT_EQ(result.reward, 1);
  EXPECT_TRUE(check("Answer: 014 \n", "14").correct);  // leading zeros, trailing whitespace
  EXPECT_TRUE(check("Answer:\t-3", "-3").correct);
  EXPECT_TRUE(check("Answer: 1\nno, wait. Answer: 2", "2").correct);  // the last marker counts
  result = check("Answer: 15", "14");
  EXPECT_TRUE(result.format_ok);
  EXPECT_FALSE(result.correct);
  EXPECT_EQ(result.reward, 0);
  for (const char* bad : {"14", "answer: 14", "Answer: 14.", "Answer: 14 apples",
                          "Answer: ", "Answer: +14", "Answer: 1 4"}) {
    result = check(bad, "14");
    EXPECT_FALSE(result.format_ok) << bad;
    EXPECT_EQ(result.reward, 0) << bad;
  }
}

std::vector<RewardCommandItem> Items(int count) {
  std::vector<RewardCommandItem> items;
  for (int i = 0; i < count; ++i)
    items.push_back({"What is " + std::to_string(i) +
                         " + 1?\nThink step by step, then give the answer on its own line.",
                     "Answer: " + std::to_string(i + 1),
                     nlohmann::json{{"answer", std::to_string(i + 1)}}});
  return items;
}

// The DataError of running `command`, or "" when it succeeds.
std::string Failure(const std::string& command, int count, double timeout = 10) {
  try {
    RunRewardCommand(command, Items(count), timeout);
  } catch (const Error& error) {
    EXPECT_EQ(error.exit_code(), kExitBadData) << error.what();
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  return "";
}

TEST(RewardCommand, ReadsOneRewardPerLineWithTheFieldsOnStdin) {
  // The command sees index, prompt, completion and the prompt line's extra field.
  const std::string command =
      "python3 -c 'import json, sys\n"
      "for line in sys.stdin:\n"
      "    item = json.loads(line)\n"
      "    ok = item[\"completion\"] == \"Answer: \" + item[\"answer\"] and \"+ 1?\" in "
      "item[\"prompt\"]\n"
      "    print(item[\"index\"] + (0.5 if ok else 0))'";
  const std::vector<double> rewards = RunRewardCommand(command, Items(3), 20);
  EXPECT_EQ(rewards, (std::vector<double>{0.5, 1.5, 2.5}));
  // awk, spaces, "\r\n" and no final newline.
  EXPECT_EQ(RunRewardCommand("awk '{ printf \" %d.25 \\r\\n\", NR }' | head -c -2", Items(2), 10),
            (std::vector<double>{1.25, 2.25}));
}

TEST(RewardCommand, LargeBatchesDoNotDeadlock) {
  // 3 MB in, 3 MB out (more than a pipe buffer each way): stdin is written while stdout is read.
  std::vector<RewardCommandItem> items = Items(2000);
  for (auto& item : items) item.completion = std::string(1500, 'x');
  const std::vector<double> rewards =
      RunRewardCommand("awk '{ printf \"%d%1500s\\n\", 1, \"\" }'", items, 60);
  ASSERT_EQ(rewards.size(), 2000u);
}

TEST(RewardCommand, TimeoutKillsTheProcessGroup) {
  const auto start = std::chrono::steady_clock::now();
  const std::string message = Failure("sleep 30; echo 1", 2, 0.5);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(message.find("ran past its timeout of 0.5 s"), std::string::npos) << message;
  EXPECT_NE(message.find("sleep 30"), std::string::npos) << message;
  // A child that closes its stdout and keeps running is still timed out.
  EXPECT_NE(Failure("exec >&-; sleep 30", 1, 0.5).find("timeout"), std::string::npos);
}

TEST(RewardCommand, CrashAndSignalAreErrors) {
  std::string message = Failure("cat > /dev/null; echo 1; echo 1; exit 3", 2);
  EXPECT_NE(message.find("exited with status 3"), std::string::npos) << message;
  message = Failure("kill -9 $$", 2);
  EXPECT_NE(message.find("killed by signal 9"), std::string::npos) << message;
}

TEST(RewardCommand, MalformedLineNamesThePrompt) {
  std::string message = Failure("cat > /dev/null; echo 1; echo abc", 2);
  EXPECT_NE(message.find("line 2 \"abc\" is not a finite number"), std::string::npos) << message;
  EXPECT_NE(message.find("completion 1, prompt \"What is 1 + 1?\\nThink step by step, then give "
                         "the answer on ...\""),
            std::string::npos)
      << message;
  EXPECT_NE(Failure("echo nan; echo 1", 2).find("line 1 \"nan\""), std::string::npos);
  EXPECT_NE(Failure("echo 1e999; echo 1", 2).find("not a finite number"), std::string::npos);
  EXPECT_NE(Failure("echo; echo 1", 2).find("line 1 \"\""), std::string::npos);
}

TEST(RewardCommand, TooFewOrTooManyLines) {
  std::string message = Failure("cat > /dev/null; echo 1", 3);
  EXPECT_NE(
      message.find(
          "printed 1 lines for 3 completions: no reward for completion 1, prompt \"What is 1"),
      std::string::npos)
      << message;
  message = Failure("echo 1; echo 2; echo 3", 2);
  EXPECT_NE(message.find("printed more than 2 lines for 2 completions"), std::string::npos)
      << message;
  EXPECT_EQ(Failure("echo 1; echo 2", 2),
            "");  // not reading stdin is allowed when the output is right
}

}  // namespace
}  // namespace crucible
