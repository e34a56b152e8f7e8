// Task and text files: lm-eval's JSONL shapes turned into (context, choices, gold).
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/lines.h"
#include "common/strings.h"
#include "eval/eval.h"
#include "eval/python_text.h"

namespace crucible {
namespace {

std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out += text.substr(pos, hit - pos) + to;
  return out + text.substr(pos);
}

// lm-eval's hellaswag preprocess(): strip() (Unicode whitespace), " [title]" -> ". ", drop
// re.sub("\\[.*?\\]", ""): a "[" up to the first "]" with no newline between ("." does not
// match one), then "  " -> " ".
std::string HellaswagPreprocess(const std::string& raw) {
  std::string text = ReplaceAll(PythonStrip(raw), " [title]", ". ");
  std::string kept;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      const size_t close = text.find(']', i + 1);
      if (close != std::string::npos && text.find('\n', i + 1) > close) {
        i = close;
        continue;
      }
    }
    kept += text[i];
  }
  return ReplaceAll(kept, "  ", " ");
}

struct LineContext {
  std::string where;  // "file:line"
  [[noreturn]] void Fail(const std::string& what) const { throw DataError(where + ": " + what); }
};

std::string StringField(const nlohmann::json& doc, const char* key, const LineContext& at) {
  if (!doc[key].is_string()) at.Fail(std::string("'") + key + "' is not a string");
  return doc[key].get<std::string>();
}

std::vector<std::string> StringList(const nlohmann::json& value, const std::string& key,
                                    const LineContext& at) {
  if (!value.is_array()) at.Fail("'" + key + "' is not a list of strings");
  std::vector<std::string> out;
  for (const auto& v : value) {
    if (!v.is_string()) at.Fail("'" + key + "' is not a list of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

int64_t IndexField(const nlohmann::json& value, const std::string& key, const LineContext& at) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    if (!s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos)
      return std::stoll(s);
  }
  at.Fail("'" + key + "' is not an integer index (got " + value.dump() + ")");
}

std::string ShapeOf(const nlohmann::json& doc) {
  if (doc.contains("ctx") && doc.contains("endings") && doc.contains("label")) return "hellaswag";
  if (doc.contains("question") && doc.contains("choices") && doc.contains("answerKey"))
    return "arc";
  if (doc.contains("context") && doc.contains("choices") && doc.contains("gold")) return "generic";
  return "";
}

ChoiceItem ParseItem(const nlohmann::json& doc, const std::string& shape, const LineContext& at) {
  ChoiceItem item;
  int64_t gold = 0;
  if (shape == "hellaswag") {
    item.choices = StringList(doc["endings"], "endings", at);
    if (doc.contains("activity_label") && doc.contains("ctx_a") && doc.contains("ctx_b")) {
      item.context = HellaswagPreprocess(StringField(doc, "activity_label", at) + ": " +
                                         StringField(doc, "ctx_a", at) + " " +
                                         PythonCapitalize(StringField(doc, "ctx_b", at)));
      for (auto& choice : item.choices) choice = HellaswagPreprocess(choice);
    } else {
      item.context = StringField(doc, "ctx", at);
    }
    gold = IndexField(doc["label"], "label", at);
  } else if (shape == "arc") {
    const auto& choices = doc["choices"];
    if (!choices.is_object() || !choices.contains("text") || !choices.contains("label"))
      at.Fail("'choices' must be an object {\"text\": [...], \"label\": [...]} as in ai2_arc");
    item.choices = StringList(choices["text"], "choices.text", at);
    std::vector<std::string> labels = StringList(choices["label"], "choices.label", at);
    if (labels.size() != item.choices.size())
      at.Fail("'choices.label' and 'choices.text' differ in length");
    item.context = "Question: " + StringField(doc, "question", at) + "\nAnswer:";
    const std::string key = StringField(doc, "answerKey", at);
    gold = -1;
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] == key) gold = static_cast<int64_t>(i);
    if (gold < 0) at.Fail("answerKey '" + key + "' is not one of choices.label");
  } else {
    item.context = StringField(doc, "context", at);
    item.choices = StringList(doc["choices"], "choices", at);
    gold = IndexField(doc["gold"], "gold", at);
  }
  if (item.choices.size() < 2)
    at.Fail(
        StrFormat("%zu choice(s); a multiple-choice item needs at least 2", item.choices.size()));
  if (gold < 0 || gold >= static_cast<int64_t>(item.choices.size()))
    at.Fail(StrFormat("label %lld is out of range for %zu choices (0-based)", (long long)gold,
                      item.choices.size()));
  item.gold = static_cast<int>(gold);
  return item;
}

}  // namespace

std::string EvalFileName(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  for (const char* suffix : {".jsonl", ".json", ".txt"})
    if (EndsWith(name, suffix)) return name.substr(0, name.size() - std::string(suffix).size());
  return name;
}

ChoiceTask LoadChoiceTask(const std::string& path) {
  if (!FileExists(path)) throw UsageError(path + ": no such task file");
  ChoiceTask task;
  task.path = path;
  task.name = EvalFileName(path);
  const std::string text = ReadFile(path);
  LineSplitter lines(text);
  for (std::string_view line; lines.Next(&line);) {
    const size_t i = lines.line_number() - 1;
    LineContext at{StrFormat("%s:%zu", path.c_str(), i + 1)};
    if (Trim(line).empty()) continue;
    nlohmann::json doc = nlohmann::json::parse(line, nullptr, false);
    if (doc.is_discarded()) at.Fail("not valid JSON; each line must be one JSON object");
    if (!doc.is_object()) at.Fail("not a JSON object");
    const std::string shape = ShapeOf(doc);
    if (shape.empty()) {
      std::string keys;
      for (const auto& [key, value] : doc.items()) keys += (keys.empty() ? "" : ", ") + key;
      at.Fail("unknown task shape (keys: " + keys +
              "); expected ctx/endings/label (hellaswag), question/choices/answerKey (arc) or "
              "context/choices/gold");
    }
    if (task.shape.empty()) task.shape = shape;
    if (shape != task.shape)
      at.Fail("a " + shape + " item in a " + task.shape + " task; one shape per file");
    ChoiceItem item = ParseItem(doc, shape, at);
    item.line = static_cast<int64_t>(i + 1);
    task.items.push_back(std::move(item));
  }
  if (task.items.empty()) throw DataError(path + ": no items (empty task file)");
  return task;
}

TextDocuments LoadTextDocuments(const std::string& path) {
  if (!FileExists(path)) throw UsageError(path + ": no such text file");
  TextDocuments text;
  text.path = path;
  text.name = EvalFileName(path);
  std::string contents = ReadFile(path);
  if (!EndsWith(path, ".jsonl")) {
    text.documents.push_back(std::move(contents));
  } else {
    LineSplitter lines(contents);
    for (std::string_view line; lines.Next(&line);) {
      if (Trim(line).empty()) continue;
      const std::string where = StrFormat("%s:%zu", path.c_str(), lines.line_number());
      nlohmann::json doc = nlohmann::json::parse(line, nullptr, false);
      if (doc.is_discarded())
        throw DataError(where + ": not valid JSON; each line must be one JSON object");
      if (!doc.is_object() || !doc.contains("text") || !doc["text"].is_string())
        throw DataError(where + ": expected an object with a string 'text'");
      text.documents.push_back(doc["text"].get<std::string>());
    }
  }
  size_t bytes = 0;
  for (const auto& d : text.documents) bytes += d.size();
  if (bytes == 0)
    throw DataError(path + ": no text to score (" +
                    (text.documents.empty()     ? std::string("no documents")
                     : EndsWith(path, ".jsonl") ? "every document's text is empty"
                                                : "the file is empty") +
                    "); bits per byte of nothing would read as a perfect 0");
  return text;
}

double MeanStderr(int64_t hits, int64_t n) {
  if (n < 2) return 0.0;
  const double mean = static_cast<double>(hits) / n;
  const double squares = hits * (1 - mean) * (1 - mean) + (n - hits) * mean * mean;
  return std::sqrt(squares / (n - 1)) / std::sqrt(static_cast<double>(n));
}

int64_t CodePoints(const std::string& text) {
  int64_t count = 0;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = text[i];
    size_t length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + length > text.size()) length = 1;
    for (size_t k = 1; k < length; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) length = 1;
    i += length;
    ++count;
  }
  return count;
}

}  // namespace crucible
