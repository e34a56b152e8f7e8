// Rewards of GRPO: the built-in verifiable tasks (a deterministic problem generator and an exact
// answer check each) and the external reward command.
//
// Built-in tasks. Every prompt ends with the instruction
//     Finish with a line "Answer: <integer>".
// The answer format: the completion's last occurrence of "Answer:" is followed by optional spaces
// or tabs, an integer (an optional '-' and 1 to 40 ASCII digits) and then only whitespace up to
// the end of the completion. Reasoning may come before it. Leading zeros are allowed ("007" is 7).
//   format_ok  the completion has that form
//   correct    format_ok and the integer equals the expected answer
//   reward     1 when correct, else 0 (the format is a separate flag, not a partial reward)
// Tasks:
//   sum_digits  "What is the sum of the digits of 48213?"  answer 18; the number has 2 to 8
//               digits (no leading zero), the count drawn uniformly
//   addition    "What is 482 + 9317?"                     answer 9799; each operand has 1 to 6
//               digits, drawn independently
// MakeProblem(task, seed, index) is a pure function of its arguments (splitmix64 of seed and
// index), so a dataset or a held-out set is a range of indices, the same on every machine.
//
// External reward command: RunRewardCommand runs `/bin/sh -c COMMAND` once per batch, in its own
// process group, stdin and stdout piped, stderr inherited. It writes one JSON object per
// completion, one per line, on the command's stdin:
//     {<the extra fields of the prompt's jsonl line>, "prompt": ..., "completion": ...,
//      "index": <the completion's index in the batch, from 0>}
// (prompt, completion and index override extra fields of the same name; invalid UTF-8 in a
// completion is written as U+FFFD), closes stdin, and reads one reward per line from stdout: a
// finite number as strtod reads it, surrounded by optional spaces ("1", "0.5", "-2e-3"); a final
// newline is optional, a "\r" before "\n" is ignored. Every failure is a DataError (exit 65, do
// not retry) of one line that names the command:
//   - it ran past the timeout: its process group is killed with SIGKILL
//   - it exited non-zero or was killed by a signal
//   - a line is not a finite number: the message names the line, the completion's index and
//     its prompt (shortened)
//   - fewer lines than completions (naming the first completion without a reward, and its prompt)
//     or more lines than completions
// There is no default reward: no failure is turned into a zero.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

enum class RewardTask { kSumDigits, kAddition };
RewardTask ParseRewardTask(const std::string& name, const std::string& key);  // UsageError
const char* RewardTaskName(RewardTask task);

struct TaskProblem {
  std::string prompt;
  std::string answer;  // the expected integer, in decimal
};
TaskProblem MakeProblem(RewardTask task, std::uint64_t seed, std::uint64_t index);

struct AnswerCheck {
  bool format_ok = false;
  bool correct = false;
  double reward = 0;  // 1 when correct, else 0
};
// The answer format above; `expected` is a decimal integer (TaskProblem::answer).
AnswerCheck CheckAnswer(std::string_view completion, std::string_view expected);

struct RewardCommandItem {
  std::string prompt, completion;
  nlohmann::json extra = nlohmann::json::object();  // other fields of the prompt's jsonl line
};

// One reward per item, in order. timeout_seconds > 0 bounds the whole run (writing, the
// command's work, reading). Throws DataError as listed above, IoError when the process cannot be
// started.
std::vector<double> RunRewardCommand(const std::string& command,
                                     const std::vector<RewardCommandItem>& items,
                                     double timeout_seconds);

}  // namespace crucible
