#include "data/stages.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

const std::vector<std::string> kStageKeys = {
    "name",      "list",         "blends",        "steps",        "tokens",
    "lr_policy", "warmup_steps", "peak_fraction", "anneal_steps", "eval_text"};
const std::vector<std::string> kBlendKeys = {"list", "weight"};
const char* kBlendsShape = "blends = [{ list = \"web.txt\", weight = 0.7 }, ...]";

// The closest of `known` to `name`, as " (did you mean 'x'?)", or "".
std::string DidYouMean(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& candidate : known)
    if (const size_t d = EditDistance(name, candidate); d < best_distance)
      best_distance = d, best = candidate;
  return best_distance <= 2 ? " (did you mean '" + best + "'?)" : "";
}

std::string Join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

// The shortest text that reads back as `value` (0.7, 3, 1e-05): a weight as it was given.
std::string ShortestNumber(double value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

// Why the file list at `path` (the value of `key`) cannot be read, or "".
std::string UnreadableList(const std::string& key, const std::string& path) {
  if (const std::string missing = StatFailure(path); !missing.empty())
    return key + " = \"" + path + "\": cannot read the file list: " + missing;
  if (IsDirectory(path))
    return key + " = \"" + path + "\" is a directory; name the blend file list in it";
  if (::access(path.c_str(), R_OK) != 0)
    return key + " = \"" + path + "\": cannot read the file list: " + std::strerror(errno);
  return "";
}

bool IsStageName(const std::string& name) {
  return !name.empty() &&
         name.find_first_not_of(
             "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") ==
             std::string::npos;
}

// One stage's table, read key by key; every error names the stage.
class StageTable {
 public:
  StageTable(const std::string& text, std::string where) : where_(std::move(where)) {
    toml::table parsed = toml::parse("stage = " + text, std::string_view("data.stages"));
    table_ = *parsed["stage"].as_table();
    for (const auto& [key, node] : table_) {
      const std::string name(key.str());
      if (std::find(kStageKeys.begin(), kStageKeys.end(), name) != kStageKeys.end()) continue;
      throw Fail("unknown key '" + name + "'" + DidYouMean(name, kStageKeys) + "; a stage takes " +
                 Join(kStageKeys, ", "));
    }
  }
  Error Fail(const std::string& why) const { return UsageError(where_ + ": " + why); }
  bool Has(const char* key) const { return table_.contains(key); }
  std::string String(const char* key, const std::string& fallback) const {
    if (!Has(key)) return fallback;
    if (auto v = table_[key].value_exact<std::string>()) return *v;
    throw Fail(std::string(key) + ": expected a string");
  }
  int64_t Int(const char* key, int64_t fallback, int64_t min) const {
    if (!Has(key)) return fallback;
    auto v = table_[key].value_exact<int64_t>();
    if (!v) throw Fail(std::string(key) + ": expected an integer");
    if (*v < min)
      throw Fail(StrFormat("%s = %lld is out of range: expected an integer >= %lld", key,
                           (long long)*v, (long long)min));
    return *v;
  }
  double Float(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    if (auto v = table_[key].value_exact<double>()) return *v;
    if (auto v = table_[key].value_exact<int64_t>()) return static_cast<double>(*v);
    throw Fail(std::string(key) + ": expected a number");
  }
  // A string or a list of strings (empty list: none).
  std::vector<std::string> Strings(const char* key) const {
    std::vector<std::string> out;
    if (!Has(key)) return out;
    if (auto v = table_[key].value_exact<std::string>()) return {*v};
    const toml::array* array = table_[key].as_array();
    if (array)
      for (const toml::node& item : *array) {
        auto v = item.value_exact<std::string>();
        if (!v) break;
        out.push_back(*v);
      }
    if (!array || out.size() != array->size())
      throw Fail(std::string(key) + ": expected a file name or a list of file names");
    return out;
  }
  // `blends`: at least one { list, weight } table, each list a readable file, each weight a
  // positive finite number. Errors name the entry ("blends #2").
  std::vector<WeightedFileList> Blends() const {
    const toml::array* array = table_["blends"].as_array();
    if (!array)
      throw Fail(std::string("blends: expected an array of tables (") + kBlendsShape + ")");
    if (array->empty())
      throw Fail(std::string("blends = []: name at least one file list (") + kBlendsShape + ")");
    std::vector<WeightedFileList> out;
    for (size_t k = 0; k < array->size(); ++k) {
      const std::string entry = StrFormat("blends #%zu", k + 1);
      const toml::table* table = array->get(k)->as_table();
      if (!table)
        throw Fail(entry + ": expected a table { list = \"blend.txt\", weight = W } (" +
                   kBlendsShape + ")");
      for (const auto& [key, node] : *table) {
        const std::string name(key.str());
        if (std::find(kBlendKeys.begin(), kBlendKeys.end(), name) == kBlendKeys.end())
          throw Fail(entry + ": unknown key '" + name + "'" + DidYouMean(name, kBlendKeys) +
                     "; an entry of blends takes list and weight");
      }
      WeightedFileList part;
      const auto list = (*table)["list"].value_exact<std::string>();
      if (!table->contains("list") || (list && list->empty()))
        throw Fail(entry +
                   ": no list: name a blend file list, { list = \"blend.txt\", weight = W }");
      if (!list) throw Fail(entry + ": list: expected a file name");
      part.list = *list;
      const std::string named = StrFormat("%s (\"%s\")", entry.c_str(), part.list.c_str());
      if (!table->contains("weight"))
        throw Fail(named + ": no weight: give the list's share of the stage, weight = W > 0");
      if (auto v = (*table)["weight"].value_exact<double>())
        part.weight = *v;
      else if (auto v = (*table)["weight"].value_exact<int64_t>())
        part.weight = static_cast<double>(*v);
      else
        throw Fail(named + ": weight: expected a number");
      if (!std::isfinite(part.weight) || part.weight <= 0)
        throw Fail(named + ": weight = " + FormatValue(part.weight) +
                   " is out of range: expected a positive finite number");
      if (const std::string why = UnreadableList(entry + ": list", part.list); !why.empty())
        throw Fail(why);
      out.push_back(std::move(part));
    }
    return out;
  }
  const std::string& where() const { return where_; }
  void Rename(const std::string& name) { where_ += " (\"" + name + "\")"; }

 private:
  toml::table table_;
  std::string where_;
};

}  // namespace

const char* LrPolicyName(LrPolicy policy) {
  switch (policy) {
    case LrPolicy::kRewarm:
      return "rewarm";
    case LrPolicy::kGentle:
      return "gentle";
    case LrPolicy::kContinue:
      break;
  }
  return "continue";
}

std::vector<DataStage> ReadDataStages(const Config& config) {
  std::vector<DataStage> stages;
  const std::vector<std::string>& tables = config.StringList("data.stages");
  std::set<std::string> names;
  for (size_t i = 0; i < tables.size(); ++i) {
    const std::string origin = config.Origin("data.stages#" + std::to_string(i));
    StageTable t(tables[i], StrFormat("%s[[data.stages]] #%zu",
                                      origin.empty() ? "" : (origin + ": ").c_str(), i + 1));
    DataStage s;
    s.index = static_cast<int>(i + 1);
    s.name = t.String("name", StrFormat("stage%zu", i + 1));
    if (!IsStageName(s.name))
      throw t.Fail("name = \"" + s.name +
                   "\": a stage name is letters, digits, '_', '.' and '-' (it appears in "
                   "key=value progress lines)");
    t.Rename(s.name);
    if (!names.insert(s.name).second)
      throw t.Fail("name \"" + s.name +
                   "\" is taken by an earlier stage; give each a name of its own");
    s.where = t.where();
    if (t.Has("list") && t.Has("blends"))
      throw t.Fail(
          "both list and blends are given; give the stage's data one way: list = \"blend.txt\" "
          "or " +
          std::string(kBlendsShape));
    if (t.Has("blends")) {
      s.blends = t.Blends();
      for (const WeightedFileList& part : s.blends)
        s.list += (s.list.empty() ? "" : "+") + ShortestNumber(part.weight) + "*" + part.list;
    } else {
      s.list = t.String("list", "");
      if (!t.Has("list") || s.list.empty())
        throw t.Fail(
            "no list: name the stage's blend file list (list = \"blend.txt\", `weight prefix "
            "[corpus]` per line, as training.dataset_path of a blend) or a blend of them (" +
            std::string(kBlendsShape) + ")");
      if (const std::string why = UnreadableList("list", s.list); !why.empty()) throw t.Fail(why);
    }
    if (t.Has("steps") && t.Has("tokens"))
      throw t.Fail("both steps and tokens are given; give the stage's length one way");
    if (!t.Has("steps") && !t.Has("tokens"))
      throw t.Fail("no length: give steps = N or tokens = N");
    s.steps = t.Int("steps", 0, 1);
    s.tokens = t.Int("tokens", 0, 1);
    const std::string policy = t.String("lr_policy", "continue");
    if (policy == "continue")
      s.lr_policy = LrPolicy::kContinue;
    else if (policy == "rewarm")
      s.lr_policy = LrPolicy::kRewarm;
    else if (policy == "gentle")
      s.lr_policy = LrPolicy::kGentle;
    else
      throw t.Fail("lr_policy = \"" + policy +
                   "\" is not a policy: choose continue, rewarm or gentle");
    if (t.Has("warmup_steps") && s.lr_policy == LrPolicy::kContinue)
      throw t.Fail(
          "warmup_steps is given but lr_policy = \"continue\" does not warm up again (the "
          "schedule goes on); remove it or choose rewarm or gentle");
    s.warmup_steps = t.Int("warmup_steps", -1, 0);
    if (s.lr_policy == LrPolicy::kGentle) {
      if (!t.Has("peak_fraction"))
        throw t.Fail(
            "lr_policy = \"gentle\" needs peak_fraction, the share of optimizer.lr it "
            "warms up to (e.g. 0.3)");
      s.peak_fraction = t.Float("peak_fraction", 1);
      if (!(s.peak_fraction > 0 && s.peak_fraction <= 1))
        throw t.Fail("peak_fraction = " + FormatValue(s.peak_fraction) +
                     " is out of range: expected a number in (0, 1]");
    } else if (t.Has("peak_fraction")) {
      throw t.Fail(StrFormat("peak_fraction is given but lr_policy = \"%s\"; it belongs to gentle",
                             LrPolicyName(s.lr_policy)));
    }
    s.anneal_steps = t.Int("anneal_steps", 0, 0);
    if (i == 0 && s.anneal_steps > 0)
      throw t.Fail(
          "anneal_steps in the first stage: there is no earlier stage's mixture to "
          "anneal from; remove it");
    s.eval_text = t.Strings("eval_text");
    for (const std::string& path : s.eval_text)
      if (path.empty() || !StatFailure(path).empty() || IsDirectory(path))
        throw t.Fail("eval_text = \"" + path + "\": " +
                     (path.empty()        ? std::string("an empty file name")
                      : IsDirectory(path) ? std::string("is a directory")
                                          : "cannot read it: " + StatFailure(path)) +
                     "; name a held-out text file (.jsonl of {\"text\"} or plain text)");
    stages.push_back(std::move(s));
  }
  return stages;
}

void ResolveDataStages(std::vector<DataStage>& stages, const BatchSchedule& batches,
                       int64_t seq_len) {
  int64_t first_step = 1;
  for (DataStage& s : stages) {
    s.first_step = first_step;
    if (s.tokens > 0) {
      const int64_t before = batches.SamplesBefore(first_step);
      auto fail = [&](const std::string& why) {
        return UsageError(s.where + ": tokens = " + std::to_string(s.tokens) + " " + why);
      };
      if (s.tokens % seq_len != 0)
        throw fail(
            StrFormat("is not a whole number of samples of training.seq_len = %lld tokens; "
                      "give a multiple of it, or steps",
                      (long long)seq_len));
      const int64_t samples = s.tokens / seq_len;
      // The fewest steps from first_step that read at least `samples` samples.
      int64_t low = 1, high = samples / batches.GlobalBatch(first_step) + 1;
      while (low < high) {
        const int64_t middle = low + (high - low) / 2;
        if (batches.SamplesBefore(first_step + middle) - before >= samples)
          high = middle;
        else
          low = middle + 1;
      }
      const int64_t read = batches.SamplesBefore(first_step + low) - before;
      if (read != samples) {
        const int64_t fewer = batches.SamplesBefore(first_step + low - 1) - before;
        const std::string choices = fewer > 0
                                        ? StrFormat("%lld or %lld", (long long)(fewer * seq_len),
                                                    (long long)(read * seq_len))
                                        : std::to_string(read * seq_len);
        throw fail(StrFormat(
            "is not a whole number of steps: from step %lld, %lld steps read %lld tokens and %lld "
            "read %lld (global batch x training.seq_len = %lld x %lld tokens a step); give tokens "
            "= %s, or steps",
            (long long)first_step, (long long)(low - 1), (long long)(fewer * seq_len),
            (long long)low, (long long)(read * seq_len),
            (long long)batches.GlobalBatch(first_step + low - 1), (long long)seq_len,
            choices.c_str()));
      }
      s.steps = low;
    }
    if (s.anneal_steps > s.steps)
      throw UsageError(
          StrFormat("%s: anneal_steps = %lld is longer than the stage (%lld steps); "
                    "anneal over at most the stage's steps",
                    s.where.c_str(), (long long)s.anneal_steps, (long long)s.steps));
    first_step += s.steps;
  }
}

std::vector<DataStage> ResolvedDataStages(const Config& config, const BatchSchedule& batches,
                                          int64_t seq_len) {
  std::vector<DataStage> stages = ReadDataStages(config);
  ResolveDataStages(stages, batches, seq_len);
  return stages;
}

int64_t TotalStageSteps(const std::vector<DataStage>& stages) {
  int64_t total = 0;
  for (const DataStage& s : stages) total += s.steps;
  return total;
}

int StageOfStep(const std::vector<DataStage>& stages, int64_t step) {
  for (size_t k = 0; k < stages.size(); ++k)
    if (step >= stages[k].first_step && step <= stages[k].last_step()) return static_cast<int>(k);
  return -1;
}

}  // namespace crucible
