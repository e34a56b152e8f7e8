// Task files in lm-eval's JSONL shapes, their errors, and the statistics of eval.h.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <utility>
#include <vector>

#include "common/error.h"
#include "eval/eval.h"

namespace crucible {
namespace {

std::string WriteTemp(const std::string& name, const std::string& contents) {
  std::string path = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << contents;
  return path;
}

int ExitCodeOf(const std::string& path, std::string* message) {
  try {
    LoadChoiceTask(path);
  } catch (const Error& e) {
    *message = e.what();
    return e.exit_code();
  }
  return 0;
}

TEST(ChoiceTask, ReadsTheThreeShapes) {
  ChoiceTask generic = LoadChoiceTask(
      WriteTemp("generic.jsonl",
                "{\"context\": \"The sky is\", \"choices\": [\"blue\", \"green\"], \"gold\": 0}\n\n"
                "{\"context\": \"Two plus two is\", \"choices\": [\"three\", \"four\", \"five\"], "
                "\"gold\": \"1\"}\n"));
  EXPECT_EQ(generic.shape, "generic");
  ASSERT_EQ(generic.items.size(), 2u);
  EXPECT_EQ(generic.items[1].gold, 1);
  EXPECT_EQ(generic.items[1].line, 3);  // blank lines are skipped but counted
  EXPECT_EQ(generic.name.find("generic"), generic.name.size() - 7);

  ChoiceTask arc =
      LoadChoiceTask(WriteTemp("arc.jsonl",
                               "{\"question\": \"Which is a planet?\", \"choices\": {\"text\": "
                               "[\"Moon\", \"Mars\"], \"label\": [\"A\", \"B\"]}, "
                               "\"answerKey\": \"B\"}\n"));
  EXPECT_EQ(arc.shape, "arc");
  EXPECT_EQ(arc.items[0].context, "Question: Which is a planet?\nAnswer:");
  EXPECT_EQ(arc.items[0].gold, 1);

  ChoiceTask plain =
      LoadChoiceTask(WriteTemp("hs_plain.jsonl",
                               "{\"ctx\": \"He opens the door\", \"endings\": [\"and walks in.\", "
                               "\"[x] sings.\"], \"label\": \"0\"}\n"));
  EXPECT_EQ(plain.shape, "hellaswag");
  EXPECT_EQ(plain.items[0].context, "He opens the door");
  EXPECT_EQ(plain.items[0].choices[1], "[x] sings.");  // no preprocessing without activity_label
}

TEST(ChoiceTask, HellaswagPreprocessingAsLmEval) {
  // lm-eval: preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()).
  ChoiceTask task = LoadChoiceTask(WriteTemp(
      "hs.jsonl",
      "{\"activity_label\": \"Removing ice from car\", \"ctx_a\": \"Then, the man writes over the "
      "snow [header] "
      "covering the window of a car.\", \"ctx_b\": \"then THE man\", \"ctx\": \"unused\", "
      "\"endings\": [\" , the man adds wax [title] to the windshield.\", \"b\", \"c\", \"d\"], "
      "\"label\": 3}\n"));
  ASSERT_EQ(task.items.size(), 1u);
  EXPECT_EQ(task.items[0].context,
            "Removing ice from car: Then, the man writes over the snow covering the window of a "
            "car. Then the man");
  EXPECT_EQ(task.items[0].choices[0], ", the man adds wax. to the windshield.");
  EXPECT_EQ(task.items[0].gold, 3);
}

TEST(ChoiceTask, HellaswagPreprocessingStripsAndCapitalizesAsPythonDoes) {
  // Expected: lm-eval's preprocess() and str.capitalize() run by Python 3.11 on this item.
  ChoiceTask task = LoadChoiceTask(WriteTemp(
      "hs_unicode.jsonl",
      "{\"activity_label\": \"\\u3000Cooking\", \"ctx_a\": \"Stir the soup\\u00a0\", \"ctx_b\": "
      "\"\\u00e9 la \\u00c9COLE \\u039f\\u0394\\u039f\\u03a3 \\ufb03\", \"ctx\": \"unused\", "
      "\"endings\": [\"\\u00a0[a\\nb] done [x].\\u2009\", \"b\"], \"label\": 0}\n"));
  ASSERT_EQ(task.items.size(), 1u);
  EXPECT_EQ(task.items[0].context,
            "Cooking: Stir the soup\u00a0 \u00c9 la \u00e9cole \u03bf\u03b4\u03bf\u03c2 \ufb03");
  // Python's "." does not match a newline, so "[a\nb]" stays.
  EXPECT_EQ(task.items[0].choices[0], "[a\nb] done .");
}

TEST(ChoiceTask, LabelOutOfRangeNamesFileAndLine) {
  std::string message;
  EXPECT_EQ(
      ExitCodeOf(WriteTemp("range.jsonl",
                           "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 0}\n"
                           "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 2}\n"),
                 &message),
      65);
  EXPECT_NE(message.find("range.jsonl:2:"), std::string::npos) << message;
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  EXPECT_EQ(ExitCodeOf(WriteTemp("arckey.jsonl",
                                 "{\"question\": \"q\", \"choices\": {\"text\": [\"a\", \"b\"], "
                                 "\"label\": [\"A\", \"B\"]}, "
                                 "\"answerKey\": \"E\"}\n"),
                       &message),
            65);
  EXPECT_NE(message.find("arckey.jsonl:1: answerKey 'E'"), std::string::npos) << message;
}

TEST(ChoiceTask, MalformedLinesAndUnknownShapes) {
  std::string message;
  EXPECT_EQ(
      ExitCodeOf(
          WriteTemp("bad.jsonl",
                    "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 0}\n{oops\n"),
          &message),
      65);
  EXPECT_NE(message.find("bad.jsonl:2: not valid JSON"), std::string::npos) << message;
  EXPECT_EQ(
      ExitCodeOf(WriteTemp("shape.jsonl", "{\"prompt\": \"a\", \"answer\": \"b\"}\n"), &message),
      65);
  EXPECT_NE(message.find("shape.jsonl:1: unknown task shape (keys: answer, prompt)"),
            std::string::npos)
      << message;
  EXPECT_EQ(ExitCodeOf(WriteTemp("mixed.jsonl",
                                 "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 0}\n"
                                 "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 0}\n"),
                       &message),
            65);
  EXPECT_NE(message.find("mixed.jsonl:2: a hellaswag item in a generic task"), std::string::npos)
      << message;
  EXPECT_EQ(ExitCodeOf(
                WriteTemp("one.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"], \"gold\": 0}\n"),
                &message),
            65);
  EXPECT_EQ(ExitCodeOf(WriteTemp("types.jsonl",
                                 "{\"context\": 3, \"choices\": [\"b\", \"c\"], \"gold\": 0}\n"),
                       &message),
            65);
  EXPECT_NE(message.find("'context' is not a string"), std::string::npos) << message;
  EXPECT_EQ(ExitCodeOf(WriteTemp("empty.jsonl", "\n\n"), &message), 65);
  EXPECT_EQ(ExitCodeOf("/nonexistent/task.jsonl", &message), 2);
  EXPECT_NE(message.find("/nonexistent/task.jsonl: no such task file"), std::string::npos)
      << message;
}

TEST(TextDocuments, AFileWithNoTextToScoreIsBadDataNamingIt) {
  auto error = [](const std::string& name, const std::string& contents) {
    const std::string path = WriteTemp(name, contents);
    try {
      LoadTextDocuments(path);
    } catch (const Error& e) {
      return std::make_pair(e.exit_code(), std::string(e.what()));
    }
    return std::make_pair(0, std::string());
  };
  for (const auto& [name, contents] : std::vector<std::pair<std::string, std::string>>{
           {"empty.txt", ""},
           {"blank_lines.jsonl", "\n\n  \n"},
           {"empty_texts.jsonl", "{\"text\": \"\"}\n{\"text\": \"\"}\n"}}) {
    auto [code, message] = error(name, contents);
    EXPECT_EQ(code, kExitBadData) << name;
    EXPECT_NE(message.find(name + ": no text to score"), std::string::npos) << message;
  }
  // Whitespace is text: its bytes are tokens the model predicts.
  EXPECT_EQ(error("newlines.txt", "\n\n\n").first, 0);
  EXPECT_EQ(error("some_empty.jsonl", "{\"text\": \"\"}\n{\"text\": \"a\"}\n").first, 0);
}

TEST(EvalStatistics, MeanStderrIsSampleStddevOverSqrtN) {
  // numpy: np.std([1,1,1,0,0], ddof=1) / sqrt(5)
  EXPECT_NEAR(MeanStderr(3, 5), 0.5477225575051661 / std::sqrt(5.0), 1e-15);
  EXPECT_EQ(MeanStderr(0, 10), 0.0);
  EXPECT_EQ(MeanStderr(1, 1), 0.0);
}

TEST(EvalStatistics, CodePointsCountAsPythonLen) {
  EXPECT_EQ(CodePoints("abc"), 3);
  EXPECT_EQ(CodePoints("caf\xc3\xa9"), 4);                    // café
  EXPECT_EQ(CodePoints("\xe2\x84\xa2 \xf0\x9f\x98\x80"), 3);  // ™ 😀
  EXPECT_EQ(CodePoints(""), 0);
}

}  // namespace
}  // namespace crucible
