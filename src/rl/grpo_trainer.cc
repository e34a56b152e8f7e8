#include "rl/grpo_trainer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "data/token_source.h"
#include "distributed/exact_group_sum.h"
#include "distributed/exact_sum.h"
#include "infer/engine.h"
#include "rl/grpo_loss.h"
#include "rl/rewards.h"
#include "sft/chat_template.h"
#include "sft/chat_template_jinja.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"

namespace crucible {
namespace {

struct GrpoSettings {
  bool command = false;  // grpo.task = command
  RewardTask task = RewardTask::kSumDigits;
  std::string prompts_path, reward_command, chat_template;
  double reward_timeout_seconds = 60;
  int64_t group_size = 4, prompts_per_step = 2, max_new_tokens = 32, iterations = 1;
  SamplingParams sampling;  // without the per-step seed
  RewardScaling scaling = RewardScaling::kGroup;
  GrpoLossConfig loss;
  // debug.grpo_average_reduction (test only): a cross-rank sum averaged over the ranks instead.
  bool average_loss_sums = false, average_entropy = false;
};

GrpoSettings ReadSettings(const Config& config) {
  GrpoSettings s;
  const std::string task = config.String("grpo.task");
  s.command = task == "command";
  if (!s.command) {
    try {
      s.task = ParseRewardTask(task, "grpo.task");
    } catch (const Error&) {
      throw UsageError("grpo.task = \"" + task +
                       "\": expected sum_digits, addition or command (grpo.reward_command)");
    }
  }
  s.prompts_path = config.String("grpo.prompts");
  s.reward_command = config.String("grpo.reward_command");
  if (s.command && s.reward_command.empty())
    throw UsageError("grpo.task = \"command\" needs grpo.reward_command (a shell command)");
  if (s.command && s.prompts_path.empty())
    throw UsageError("grpo.task = \"command\" needs grpo.prompts (a .jsonl of {\"prompt\": ...})");
  if (!s.command && !s.reward_command.empty())
    throw UsageError("grpo.reward_command is set but grpo.task = \"" + task +
                     "\" (set grpo.task = \"command\" to use it)");
  s.chat_template = config.String("grpo.chat_template");
  if (!s.chat_template.empty()) {
    try {
      CheckChatTemplateName(s.chat_template);
    } catch (const Error& e) {
      throw UsageError(std::string("grpo.chat_template: ") + e.what());
    }
  }
  s.reward_timeout_seconds = config.Float("grpo.reward_timeout_seconds");
  s.group_size = config.Int("grpo.group_size");
  s.prompts_per_step = config.Int("grpo.prompts_per_step");
  s.max_new_tokens = config.Int("grpo.max_new_tokens");
  s.iterations = config.Int("grpo.iterations");
  s.sampling.temperature = config.Float("grpo.temperature");
  s.sampling.top_p = config.Float("grpo.top_p");
  if (!(s.sampling.top_p > 0)) throw UsageError("grpo.top_p = 0: expected a number in (0, 1]");
  s.sampling.top_k = config.Int("grpo.top_k");
  s.sampling.max_new_tokens = s.max_new_tokens;
  s.sampling.stop_at_eos = true;
  s.scaling = ParseRewardScaling(config.String("grpo.scale_rewards"), "grpo.scale_rewards");
  s.loss.loss_type = ParseGrpoLossType(config.String("grpo.loss_type"), "grpo.loss_type");
  s.loss.importance_sampling_level = ParseImportanceSamplingLevel(
      config.String("grpo.importance_sampling_level"), "grpo.importance_sampling_level");
  s.loss.beta = config.Float("grpo.beta");
  s.loss.epsilon_low = config.Float("grpo.epsilon");
  const double high = config.Float("grpo.epsilon_high");
  s.loss.epsilon_high = high < 0 ? s.loss.epsilon_low : high;
  s.loss.max_completion_length = static_cast<double>(s.max_new_tokens);
  const std::string average = config.String("debug.grpo_average_reduction");
  s.average_loss_sums = average == "loss_sums";
  s.average_entropy = average == "entropy";
  if (!average.empty() && !s.average_loss_sums && !s.average_entropy)
    throw UsageError("debug.grpo_average_reduction = \"" + average +
                     "\": expected loss_sums, entropy or \"\" (a test-only switch)");
  return s;
}

// One prompt of the dataset.
struct PromptItem {
  std::string prompt, answer;  // answer: "" for the reward command
  nlohmann::json extra = nlohmann::json::object();
};

std::vector<PromptItem> ReadPrompts(const std::string& path, bool need_answer) {
  std::vector<PromptItem> items;
  std::istringstream in(ReadFile(path));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = StrFormat("%s:%lld: ", path.c_str(), (long long)number);
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string() ||
        j["prompt"].get<std::string>().empty())
      throw DataError(where + "expected a JSON object with a non-empty string \"prompt\"");
    PromptItem item;
    item.prompt = j["prompt"].get<std::string>();
    if (j.contains("answer")) {
      const nlohmann::json& a = j["answer"];
      if (a.is_number_integer())
        item.answer = a.dump();
      else if (a.is_string())
        item.answer = a.get<std::string>();
      else
        throw DataError(where + "\"answer\" is neither an integer nor a string");
    }
    if (need_answer && item.answer.empty())
      throw DataError(where +
                      "a built-in task (grpo.task) needs an \"answer\" (the expected integer)");
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "prompt") item.extra[it.key()] = it.value();
    items.push_back(std::move(item));
  }
  if (items.empty()) throw DataError(path + ": grpo.prompts holds no prompt");
  return items;
}

// The entropy -Σ p log p of the distribution softmax(z) over `vocab` logits: H = log Σ e^(z - max)
// - Σ e^(z - max) (z - max) / Σ e^(z - max), in double, in vocabulary order.
float TokenEntropy(const float* z, int64_t vocab) {
  const double top = *std::max_element(z, z + vocab);
  double sum = 0, weighted = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double d = static_cast<double>(z[v]) - top, e = std::exp(d);
    sum += e;
    weighted += e * d;
  }
  return static_cast<float>(std::log(sum) - weighted / sum);
}

// The trainer's DataLoader reads nothing of it: every step's batch comes from the rollouts.
class RolloutPlaceholder : public TokenSource {
 public:
  explicit RolloutPlaceholder(int64_t seq_len) : seq_len_(seq_len) {}
  void Sample(int64_t, int32_t* tokens) const override { std::fill_n(tokens, seq_len_ + 1, 0); }
  std::string Describe() const override { return "grpo_rollouts"; }

 private:
  int64_t seq_len_;
};

// The sums of a step that cross ranks (GrpoBatches::ReduceStep): one value each, the sum over the
// step's completions (or, for the loss sums, its micro-batches) on every rank.
enum StepSum : size_t {
  kRewards,        // Σ r
  kRewardSquares,  // Σ r²
  kCorrect,        // completions whose answer is right (built-in tasks)
  kFormatOk,       // completions in the answer format (built-in tasks)
  kTruncated,      // completions that hit grpo.max_new_tokens
  kEntropy,        // Σ over completion tokens of the policy's entropy
  kLoss,           // GrpoLossSums fields, per micro-batch
  kLossTokens,
  kKl,
  kRatio,
  kClipCounted,
  kClipLow,
  kClipHigh,
  kClipRegion,
  kCispoClip,
  kStepSums
};

// Bytes as lowercase hex, and back: how a checkpoint holds arrays bit for bit.
std::string ToHex(const void* data, size_t bytes) {
  static const char digits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * bytes, '0');
  for (size_t i = 0; i < bytes; ++i)
    out[2 * i] = digits[p[i] >> 4], out[2 * i + 1] = digits[p[i] & 15];
  return out;
}
template <typename T>
std::string ArrayToHex(const std::vector<T>& values) {
  return ToHex(values.data(), values.size() * sizeof(T));
}
// `key` of a checkpoint's GRPO batch state, as `count` values of T; DataError when it is not.
template <typename T>
std::vector<T> ArrayFromHex(const nlohmann::json& state, const char* key, size_t count,
                            const std::string& where) {
  const std::string hex =
      state.contains(key) && state[key].is_string() ? state[key].get<std::string>() : std::string();
  if (hex.size() != 2 * count * sizeof(T))
    throw DataError(
        StrFormat("%s: step_batches.batch.%s is not %zu values (a damaged or foreign "
                  "checkpoint; resume from another or start over with --resume none)",
                  where.c_str(), key, count));
  std::vector<T> values(count);
  auto* out = reinterpret_cast<unsigned char*>(values.data());
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < hex.size() / 2; ++i)
    out[i] = static_cast<unsigned char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return values;
}

// Where the run's initial weights (the reference) come from, for the checkpoint and messages.
std::string InitialWeightsSource(const Config& config) {
  if (!config.String("checkpoint.initial_load_hf").empty())
    return "checkpoint.initial_load_hf = " + config.String("checkpoint.initial_load_hf");
  if (!config.String("model.init_weights").empty())
    return "model.init_weights = " + config.String("model.init_weights");
  return StrFormat("the seeded init (debug.seed = %lld)", (long long)config.Int("debug.seed"));
}

class GrpoBatches : public StepBatches {
 public:
  GrpoBatches(Trainer& trainer, GrpoSettings settings)
      : trainer_(trainer), s_(std::move(settings)), step_sum_(trainer.comm(), ExactGrid()) {
    const Config& config = trainer.config();
    seed_ = static_cast<uint64_t>(config.Int("debug.seed"));
    seq_len_ = trainer.training().shape.seq_len;
    micro_batch_ = trainer.training().shape.micro_batch;
    const std::string tokenizer_path = config.String("model.tokenizer_path");
    if (tokenizer_path.empty())
      throw UsageError(
          "crucible grpo needs model.tokenizer_path (the tokenizer.json that encodes "
          "prompts and decodes completions)");
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::Load(tokenizer_path));
    if (!s_.prompts_path.empty()) prompts_ = ReadPrompts(s_.prompts_path, !s_.command);
    if (!s_.chat_template.empty()) {
      RequireChatMarkers(*tokenizer_, s_.chat_template,
                         "model.tokenizer_path = " + tokenizer_path + " (grpo.chat_template)");
      if (tokenizer_->bos_id() >= 0)
        chat_tokens_.bos_token = tokenizer_->IdToToken(static_cast<uint32_t>(tokenizer_->bos_id()));
      if (tokenizer_->eos_id() >= 0)
        chat_tokens_.eos_token = tokenizer_->IdToToken(static_cast<uint32_t>(tokenizer_->eos_id()));
      end_of_turn_ = tokenizer_->TokenToId(ChatTemplateEndOfTurn(s_.chat_template));
    }
    Communicator& comm = trainer.comm();
    ranks_ = comm.size();
    rank_ = comm.rank();
    total_ = s_.prompts_per_step * s_.group_size;
    if (total_ % ranks_ != 0)
      throw UsageError(StrFormat(
          "grpo.prompts_per_step x grpo.group_size = %lld completions per step do not split "
          "over %d ranks",
          (long long)total_, ranks_));
    local_ = total_ / ranks_;
    first_ = rank_ * local_;
    Config copy = config;
    spec_ = BuildModelSpec(copy);
    keep_batch_ = s_.iterations > 1 && trainer.checkpointing().enabled();
    const ResumePoint& resume = trainer.resume_point();
    if (!resume.resumed) {
      // The reference is the initial weights: their source and hash go in every checkpoint.
      const float* weights = trainer.WeightsOnEveryRank();
      const uint64_t hash = Hash64(weights, trainer.whole_table().total() * sizeof(float));
      trainer.ReleaseFullCopies();
      reference_ = {{"source", InitialWeightsSource(config)}, {"xxh3", HexU64(hash)}};
      if (s_.loss.beta > 0) trainer.KeepReferenceWeights();
      return;
    }
    const std::string where = resume.path + "/state.json";
    const nlohmann::json& state = resume.progress.step_batches;
    if (!state.is_object() || !state.contains("reference") || !state["reference"].contains("xxh3"))
      throw DataError(where +
                      ": holds no GRPO state (step_batches): not a crucible grpo checkpoint; "
                      "resume from one, or start over with --resume none");
    reference_ = state["reference"];
    if (s_.loss.beta > 0) {
      const std::string hash = HexU64(trainer.KeepInitialWeightsAsReference());
      if (hash != reference_["xxh3"].get<std::string>())
        throw DataError(StrFormat(
            "cannot resume from %s: the reference weights reloaded from %s hash %s, the run "
            "started from %s (the initial weights changed; restore them, or start over with "
            "--resume none)",
            resume.path.c_str(), InitialWeightsSource(config).c_str(), hash.c_str(),
            reference_["xxh3"].get<std::string>().c_str()));
    }
    if (state.contains("batch")) restored_ = state["batch"];
    restored_where_ = where;
  }

  // After step k: the reference's source and hash, and, inside a rollout batch (k not a
  // multiple of grpo.iterations), the batch itself: every completion's row, rewards and flags,
  // and its old and reference log-probabilities, bit for bit (what the next iterations read).
  nlohmann::json CheckpointState(int64_t step) override {
    nlohmann::json state = {{"rollout_step", (step - 1) / s_.iterations + 1},
                            {"reference", reference_}};
    if (step % s_.iterations == 0) return state;
    if (!keep_batch_)
      throw Error(kExitFailure, "internal: a GRPO checkpoint inside a batch that was not kept");
    std::vector<int32_t> prompt_lengths(prompt_lengths_.begin(), prompt_lengths_.end());
    state["batch"] = {{"rollout_step", (step - 1) / s_.iterations + 1},
                      {"rows", rows_},
                      {"prompt_lengths", prompt_lengths},
                      {"rewards", ArrayToHex(rewards_)},
                      {"correct", ArrayToHex(correct_)},
                      {"format_ok", ArrayToHex(format_ok_)},
                      {"lengths", ArrayToHex(lengths_)},
                      {"truncated", ArrayToHex(truncated_)},
                      {"old_logp", ArrayToHex(all_old_logp_)}};
    if (s_.loss.beta > 0) state["batch"]["ref_logp"] = ArrayToHex(all_ref_logp_);
    return state;
  }

  const Batch& Next(int64_t step) override {
    const int64_t rollout_step = (step - 1) / s_.iterations + 1;
    first_iteration_ = (step - 1) % s_.iterations == 0;
    generation_seconds_ = reward_seconds_ = 0;
    Timer score_timer;
    if (!first_iteration_ && !restored_.is_null()) {
      RestoreBatch(rollout_step);
    } else if (first_iteration_) {
      Rollout(rollout_step);
      score_timer.Reset();
      // The old log-probabilities are the first iteration's own forward (WeighMicroBatch).
      old_logp_.assign(local_ * seq_len_, 0.0f);
      if (s_.loss.beta > 0) {
        ref_logp_.assign(local_ * seq_len_, 0.0f);
        trainer_.ScoreTargets(batch_, ref_logp_.data(), /*reference=*/true);
        if (keep_batch_) {  // every rank's, for a checkpoint inside the batch
          all_ref_logp_.assign(total_ * seq_len_, 0.0f);
          trainer_.comm().AllGatherFloat(ref_logp_.data(), all_ref_logp_.data(), ref_logp_.size(),
                                         "grpo reference log-probabilities all-gather");
        }
      }
    }
    score_seconds_ = score_timer.Seconds();
    logp_.assign(local_ * seq_len_, 0.0f);
    entropy_.assign(local_ * seq_len_, 0.0f);
    dloss_.assign(local_ * seq_len_, 0.0f);
    loss_sums_.assign(local_ / micro_batch_, GrpoLossSums());
    train_timer_.Reset();
    return batch_;
  }

  // The loss weights come from the training forward: at the first iteration of a rollout batch
  // its log-probabilities are the old ones (the rollout weights), so no scoring pass runs for
  // the policy, only for the reference.
  bool WeightsFromForward() const override { return true; }

  // Micro-batch m: the policy's log-probabilities and entropy from the forward, the old ones at
  // the first iteration, then GrpoLoss: its sums (ReduceStep reduces them) and the loss weights
  // -dL/dlogp of the micro-batch's completion tokens.
  void WeighMicroBatch(int64_t, int64_t m, const float* logp, const float* logits,
                       int64_t vocab) override {
    const int64_t length = batch_.micro_lengths[m], positions = micro_batch_ * length;
    const size_t at = At(m * micro_batch_, 0);
    std::copy(logp, logp + positions, logp_.begin() + at);
    if (first_iteration_) std::copy(logp, logp + positions, old_logp_.begin() + at);
    for (int64_t i = 0; i < positions; ++i)
      if (mask_[at + i] != 0) entropy_[at + i] = TokenEntropy(logits + i * vocab, vocab);
    const std::span<const float> ref =
        s_.loss.beta > 0 ? std::span<const float>(ref_logp_).subspan(at, positions)
                         : std::span<const float>();
    loss_sums_[m] =
        GrpoLoss(s_.loss, totals_, micro_batch_, length,
                 std::span<const float>(logp_).subspan(at, positions),
                 std::span<const float>(old_logp_).subspan(at, positions), ref,
                 std::span<const float>(mask_).subspan(at, positions),
                 std::span<const double>(advantages_).subspan(m * micro_batch_, micro_batch_),
                 std::span<float>(dloss_).subspan(at, positions));
    for (int64_t i = 0; i < positions; ++i)
      batch_.loss_weights[at + i] = mask_[at + i] != 0 ? -dloss_[at + i] : 0.0f;
  }

  void AfterBackward(int64_t) override {
    if (first_iteration_ && keep_batch_) {  // every rank's, for a checkpoint inside the batch
      all_old_logp_.assign(total_ * seq_len_, 0.0f);
      trainer_.comm().AllGatherFloat(old_logp_.data(), all_old_logp_.data(), old_logp_.size(),
                                     "grpo old log-probabilities all-gather");
    }
    ComputeEntropy();
    ReduceStep();
  }

  double Normalizer(int64_t) override { return 1.0; }  // the weights carry the aggregation

  std::vector<std::pair<std::string, double>> Metrics(int64_t step) override {
    const GrpoMetrics m = GrpoMetricsFromSums(sums_);
    std::vector<std::pair<std::string, double>> out = {
        {"rollout_step", static_cast<double>((step - 1) / s_.iterations + 1)},
        {"reward_mean", reward_mean_},
        {"reward_std", reward_std_}};
    if (!s_.command) out.emplace_back("accuracy", accuracy_);
    if (!s_.command) out.emplace_back("format_rate", format_rate_);
    out.insert(out.end(), {{"completion_length", completion_length_},
                           {"truncated_rate", truncated_rate_},
                           {"trained_positions", static_cast<double>(trained_positions_)},
                           {"grpo_loss", sums_.loss},
                           {"kl", m.kl},
                           {"entropy", entropy_mean_},
                           {"mean_ratio", m.mean_ratio},
                           {"clip_ratio_low_mean", m.clip_low_mean},
                           {"clip_ratio_high_mean", m.clip_high_mean},
                           {"clip_ratio_region_mean", m.clip_region_mean},
                           {"generation_s", generation_seconds_},
                           {"reward_s", reward_seconds_},
                           {"score_s", score_seconds_},
                           {"train_s", train_timer_.Seconds()}});
    return out;
  }

 private:
  // The prompt (and answer) of the step's prompt j.
  PromptItem PromptOf(int64_t rollout_step, int64_t j) const {
    const int64_t index = (rollout_step - 1) * s_.prompts_per_step + j;
    if (!prompts_.empty()) return prompts_[static_cast<size_t>(index) % prompts_.size()];
    const TaskProblem problem = MakeProblem(s_.task, seed_, static_cast<uint64_t>(index));
    PromptItem item;
    item.prompt = problem.prompt;
    item.answer = problem.answer;
    return item;
  }

  // Samples this rank's completions, rewards every completion of the step, fills batch_ and the
  // advantages and totals.
  void Rollout(int64_t rollout_step) {
    const int64_t G = s_.group_size;
    std::vector<PromptItem> items;
    std::vector<std::vector<int32_t>> prompt_tokens;
    for (int64_t j = 0; j < s_.prompts_per_step; ++j) {
      items.push_back(PromptOf(rollout_step, j));
      std::vector<int32_t> tokens;
      const std::string text = s_.chat_template.empty()
                                   ? items.back().prompt
                                   : RenderChat(s_.chat_template, {{"user", items.back().prompt}},
                                                /*add_generation_prompt=*/true, chat_tokens_)
                                         .text;
      for (uint32_t t : tokenizer_->Encode(text)) tokens.push_back(static_cast<int32_t>(t));
      if (tokens.empty())
        throw DataError(
            StrFormat("grpo: the prompt of rollout step %lld, prompt %lld, encodes "
                      "to no tokens",
                      (long long)rollout_step, (long long)j));
      if (static_cast<int64_t>(tokens.size()) + s_.max_new_tokens > seq_len_)
        throw UsageError(StrFormat(
            "grpo: a prompt of %zu tokens + grpo.max_new_tokens = %lld do not fit "
            "training.seq_len = %lld (rollout step %lld, prompt \"%s\"): raise seq_len or lower "
            "max_new_tokens",
            tokens.size(), (long long)s_.max_new_tokens, (long long)seq_len_,
            (long long)rollout_step, items.back().prompt.substr(0, 60).c_str()));
      prompt_tokens.push_back(std::move(tokens));
    }
    // Generation: this rank's completions, from the current weights.
    Timer generation_timer;
    const float* weights = trainer_.WeightsOnEveryRank();
    const ParameterTable& table = trainer_.whole_table();
    FlatParameterAccess access(table, weights, nullptr);
    std::unique_ptr<InferenceModel> inference =
        spec_->StartInference(access, local_, seq_len_, DefaultCpuBackend());
    trainer_.ReleaseFullCopies();
    Engine engine(*inference, tokenizer_.get(), tokenizer_->eos_id());
    if (end_of_turn_ >= 0 && end_of_turn_ != tokenizer_->eos_id()) engine.AddEosId(end_of_turn_);
    SamplingParams params = s_.sampling;
    const uint64_t step_key = static_cast<uint64_t>(rollout_step);
    params.seed = Hash64(&step_key, sizeof(step_key), seed_);
    std::vector<int64_t> ids;
    for (int64_t c = first_; c < first_ + local_; ++c) {
      GenerationRequest request;
      request.prompt = prompt_tokens[c / G];
      request.params = params;
      request.index = static_cast<uint64_t>(c);
      ids.push_back(engine.Add(std::move(request)));
    }
    while (engine.Busy()) engine.Step();
    generation_seconds_ = generation_timer.Seconds();

    // This rank's completions, and what every rank needs of every completion (the texts for
    // the rewards, the rows for a checkpoint inside the batch).
    nlohmann::json mine = nlohmann::json::array();
    for (int64_t i = 0; i < local_; ++i) {
      const Sequence& seq = engine.sequence(ids[i]);
      const std::vector<int32_t>& prompt = prompt_tokens[(first_ + i) / G];
      std::vector<int32_t> row = prompt;
      row.insert(row.end(), seq.tokens.begin(), seq.tokens.end());
      mine.push_back({{"text", seq.text},
                      {"row", row},
                      {"prompt_length", static_cast<int64_t>(prompt.size())},
                      {"length", static_cast<int64_t>(seq.tokens.size())},
                      {"truncated", seq.finish == FinishReason::kLength ||
                                        seq.finish == FinishReason::kContextFull}});
      engine.Free(ids[i]);
    }
    // Every completion of the step, in completion order, on every rank.
    std::vector<std::string> texts(total_);
    rows_.assign(total_, {});
    prompt_lengths_.assign(total_, 0);
    lengths_.assign(total_, 0);
    truncated_.assign(total_, 0);
    // (Communicator::AllGatherString is for short strings: each rank broadcasts its own.)
    const std::string own = mine.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::vector<std::string> gathered(ranks_);
    for (int r = 0; r < ranks_; ++r) {
      if (r == rank_) gathered[r] = own;
      trainer_.comm().BroadcastString(&gathered[r], r, "grpo completions broadcast");
    }
    for (int r = 0; r < ranks_; ++r) {
      const nlohmann::json part = nlohmann::json::parse(gathered[r]);
      for (int64_t i = 0; i < local_; ++i) {
        const int64_t c = r * local_ + i;
        texts[c] = part[i]["text"].get<std::string>();
        rows_[c] = part[i]["row"].get<std::vector<int32_t>>();
        prompt_lengths_[c] = part[i]["prompt_length"].get<int64_t>();
        lengths_[c] = part[i]["length"].get<double>();
        truncated_[c] = part[i]["truncated"].get<bool>() ? 1.0 : 0.0;
      }
    }
    // Rewards.
    Timer reward_timer;
    rewards_.assign(total_, 0);
    format_ok_.assign(total_, 0);
    correct_.assign(total_, 0);
    if (!s_.command) {
      for (int64_t c = 0; c < total_; ++c) {
        const AnswerCheck check = CheckAnswer(texts[c], items[c / G].answer);
        rewards_[c] = check.reward;
        format_ok_[c] = check.format_ok;
        correct_[c] = check.correct;
      }
    } else {
      // Rank 0 runs the command over the whole step; a failure stops every rank with its line.
      std::string message;
      if (rank_ == 0) {
        std::vector<RewardCommandItem> command_items(total_);
        for (int64_t c = 0; c < total_; ++c) {
          command_items[c].prompt = items[c / G].prompt;
          command_items[c].completion = texts[c];
          command_items[c].extra = items[c / G].extra;
        }
        nlohmann::json reply;
        try {
          const std::vector<double> values =
              RunRewardCommand(s_.reward_command, command_items, s_.reward_timeout_seconds);
          reply = {{"rewards", values}};
        } catch (const Error& e) {
          reply = {
              {"error", StrFormat("grpo rollout step %lld: %s", (long long)rollout_step, e.what())},
              {"code", e.exit_code()}};
        }
        message = reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }
      trainer_.comm().BroadcastString(&message, 0, "grpo rewards broadcast");
      const nlohmann::json reply = nlohmann::json::parse(message);
      if (reply.contains("error"))
        throw Error(reply["code"].get<int>(),
                    rank_ == 0 ? reply["error"].get<std::string>()
                               : "rank " + std::to_string(rank_) +
                                     ": stopped: the reward command failed on rank 0 (rank 0 "
                                     "says why)");
      rewards_ = reply["rewards"].get<std::vector<double>>();
    }
    reward_seconds_ = reward_timer.Seconds();
    BuildBatch();
  }

  // A checkpoint's batch (CheckpointState) back into the members Rollout and the first
  // iteration's scoring fill, for this rank's slice of any rank count.
  void RestoreBatch(int64_t rollout_step) {
    const nlohmann::json& b = restored_;
    const std::string& where = restored_where_;
    if (b.value("rollout_step", int64_t{-1}) != rollout_step || !b.contains("rows") ||
        !b["rows"].is_array() || b["rows"].size() != static_cast<size_t>(total_))
      throw DataError(StrFormat(
          "%s: step_batches.batch is not rollout step %lld's %lld completions (a damaged or "
          "foreign checkpoint; resume from another or start over with --resume none)",
          where.c_str(), (long long)rollout_step, (long long)total_));
    const size_t n = static_cast<size_t>(total_);
    rows_ = b["rows"].get<std::vector<std::vector<int32_t>>>();
    const std::vector<int32_t> prompt_lengths = b.value("prompt_lengths", std::vector<int32_t>());
    prompt_lengths_.assign(prompt_lengths.begin(), prompt_lengths.end());
    if (prompt_lengths_.size() != n)
      throw DataError(where + ": step_batches.batch.prompt_lengths is not one per completion");
    for (size_t c = 0; c < n; ++c)
      if (static_cast<int64_t>(rows_[c].size()) > seq_len_ || prompt_lengths_[c] < 1 ||
          prompt_lengths_[c] > static_cast<int64_t>(rows_[c].size()))
        throw DataError(
            StrFormat("%s: step_batches.batch row %zu does not fit training.seq_len "
                      "= %lld",
                      where.c_str(), c, (long long)seq_len_));
    rewards_ = ArrayFromHex<double>(b, "rewards", n, where);
    correct_ = ArrayFromHex<double>(b, "correct", n, where);
    format_ok_ = ArrayFromHex<double>(b, "format_ok", n, where);
    lengths_ = ArrayFromHex<double>(b, "lengths", n, where);
    truncated_ = ArrayFromHex<double>(b, "truncated", n, where);
    const size_t positions = n * static_cast<size_t>(seq_len_);
    all_old_logp_ = ArrayFromHex<float>(b, "old_logp", positions, where);
    const size_t at = static_cast<size_t>(first_ * seq_len_), count = local_ * seq_len_;
    old_logp_.assign(all_old_logp_.begin() + at, all_old_logp_.begin() + at + count);
    if (s_.loss.beta > 0) {
      all_ref_logp_ = ArrayFromHex<float>(b, "ref_logp", positions, where);
      ref_logp_.assign(all_ref_logp_.begin() + at, all_ref_logp_.begin() + at + count);
    }
    BuildBatch();
    restored_ = nullptr;
    PrintLine(StrFormat("phase=grpo_resume rollout_step=%lld completions=%lld from=%s",
                        (long long)rollout_step, (long long)total_, where.c_str()));
  }

  // This rank's rows of the step (from rows_), and the step's advantages, totals and reward
  // metrics (from the rewards and flags of every completion: sums in completion order).
  //
  // The rows are trained in order of length (rows_ sorted by length, ties in completion order:
  // order_), micro-batch g of the step (training.local_batch_size rows) taking rows g B ..
  // (g + 1) B - 1 of that order, and each micro-batch runs at its longest row's length rounded up
  // to a multiple of 8 (Batch::micro_lengths), so that short completions do not pay for the long
  // ones' padding. Both are pure functions of the step's rows: the same on every rank, at any
  // rank count, and after a resume. Rank r trains micro-batches [r A, (r + 1) A) (A per rank),
  // whichever rank sampled their completions (every rank holds every row).
  void BuildBatch() {
    order_.resize(total_);
    for (int64_t c = 0; c < total_; ++c) order_[c] = c;
    std::stable_sort(order_.begin(), order_.end(),
                     [this](int64_t a, int64_t b) { return rows_[a].size() < rows_[b].size(); });
    batch_ = Batch();
    batch_.first_sample = first_;
    batch_.samples = local_;
    batch_.seq_len = seq_len_;
    // Every micro-batch's length (the step's: trained_positions), this rank's in the batch.
    std::vector<int64_t> lengths(total_ / micro_batch_, 1);
    for (int64_t c = 0; c < total_; ++c) {
      const int64_t inputs = static_cast<int64_t>(rows_[order_[c]].size()) - 1;
      int64_t& length = lengths[c / micro_batch_];
      length = std::max(length, std::min(seq_len_, (inputs + 7) / 8 * 8));
    }
    trained_positions_ = 0;
    for (int64_t length : lengths) trained_positions_ += micro_batch_ * length;
    batch_.micro_lengths.assign(lengths.begin() + first_ / micro_batch_,
                                lengths.begin() + (first_ + local_) / micro_batch_);
    batch_.inputs.assign(local_ * seq_len_, 0);
    batch_.targets.assign(local_ * seq_len_, -1);
    batch_.loss_weights.assign(local_ * seq_len_, 0.0f);
    mask_.assign(local_ * seq_len_, 0.0f);
    for (int64_t i = 0; i < local_; ++i) {
      const std::vector<int32_t>& row = rows_[Completion(i)];
      const int64_t n = static_cast<int64_t>(row.size());
      const int64_t p = prompt_lengths_[Completion(i)];
      for (int64_t t = 0; t + 1 < n; ++t) {
        batch_.inputs[At(i, t)] = row[t];
        if (t + 1 >= p) {  // the target is a completion token
          batch_.targets[At(i, t)] = row[t + 1];
          mask_[At(i, t)] = 1.0f;
        }
      }
    }
    const std::vector<double> advantages = ComputeAdvantages(rewards_, s_.group_size, s_.scaling);
    advantages_.resize(local_);
    for (int64_t i = 0; i < local_; ++i) advantages_[i] = advantages[Completion(i)];
    ReduceTotals();
  }

  // The completion that this rank's row i trains (BuildBatch's order).
  int64_t Completion(int64_t i) const { return order_[first_ + i]; }
  // Where row i's position t is in every per-position array of this rank's batch (inputs,
  // targets, loss weights, mask, log-probabilities, entropy): micro-batch m = i / B's block of
  // B x seq_len positions, its rows micro_lengths[m] long one after the other.
  size_t At(int64_t i, int64_t t) const {
    const int64_t m = i / micro_batch_, r = i % micro_batch_;
    return static_cast<size_t>(m * micro_batch_ * seq_len_ + r * batch_.micro_lengths[m] + t);
  }

  // This rank's entropy sum over its completion tokens, each completion's in position order (the
  // step's mean, TRL's `entropy`, is ReduceStep's sum over the step's completion tokens).
  void ComputeEntropy() {
    entropy_sums_.assign(local_, 0.0);
    for (int64_t i = 0; i < local_; ++i)
      for (int64_t t = 0; t < batch_.micro_lengths[i / micro_batch_]; ++t)
        if (mask_[At(i, t)] != 0) entropy_sums_[i] += entropy_[At(i, t)];
  }

  // ---- Every reduction across ranks of a step, here and only here. ----
  //
  // The group is the data-parallel group: every rank of the run (crucible grpo refuses tensor and
  // expert parallelism). Each sum goes through ExactGroupSum (distributed/exact_group_sum.h) on
  // the fixed128 grid: every rank puts each of its own contributions (one completion's value, or
  // one micro-batch's loss sums) on the grid 2^-64 (DoubleToFixed: exact for |v| >= 2^-12, the
  // rest truncated at 2^-64), adds them as integers and the group adds the integers, so a sum is
  // the same bits in any order and for any rank layout; it is rounded to a double once. The two
  // extremes of the clip metrics (MIN and MAX, exact in any order) are gathered beside it.
  //
  //  ReduceTotals (after the rollout; the loss needs them): GrpoBatchTotals.tokens, the step's
  //    completion tokens, over the step's completions; .sequences and .micro_batches are the
  //    step's shape, known on every rank.
  //  ReduceStep (after the loss weights; the metrics): StepSum above, over the step's completions
  //    (rewards, flags, entropy) and micro-batches (loss sums).
  //
  // Not a reduction: the completions themselves (text, row, length) are gathered to every rank, and
  // each group's advantages are computed from its G rewards in completion order on every rank
  // (ComputeAdvantages), the same bits everywhere.
  void ReduceTotals() {
    __int128 tokens = 0, value = 0;
    for (int64_t i = 0; i < local_; ++i) {
      DoubleToFixed(lengths_[Completion(i)], &value);  // a count: always on the grid
      tokens += value;
    }
    step_sum_.AllReduce(&tokens, 1, "grpo completion tokens");
    totals_ = GrpoBatchTotals();
    totals_.sequences = static_cast<double>(total_);
    totals_.micro_batches = static_cast<double>(total_ / micro_batch_);
    totals_.tokens = FixedToDouble(tokens);
  }

  void ReduceStep() {
    // [0, kStepSums): the sums; [kStepSums, 2 kStepSums): contributions that were not finite
    // (or beyond 2^62), whose sum is then NaN, as an unreduced sum of them would be.
    std::vector<__int128> sums(2 * kStepSums, 0);
    const auto add = [&sums](size_t k, double v) {
      __int128 fixed = 0;
      if (DoubleToFixed(v, &fixed))
        sums[k] += fixed;
      else
        sums[kStepSums + k] += 1;
    };
    for (int64_t i = 0; i < local_; ++i) {
      const int64_t c = Completion(i);
      add(kRewards, rewards_[c]);
      add(kRewardSquares, rewards_[c] * rewards_[c]);
      add(kCorrect, correct_[c]);
      add(kFormatOk, format_ok_[c]);
      add(kTruncated, truncated_[c]);
      add(kEntropy, entropy_sums_[i]);
    }
    double extremes[2] = {1e300, -1e300};  // MIN of clip_low_min, MAX of clip_high_max
    for (const GrpoLossSums& m : loss_sums_) {
      add(kLoss, m.loss);
      add(kLossTokens, m.tokens);
      add(kKl, m.kl);
      add(kRatio, m.ratio);
      add(kClipCounted, m.clip_counted);
      add(kClipLow, m.clip_low);
      add(kClipHigh, m.clip_high);
      add(kClipRegion, m.clip_region);
      add(kCispoClip, m.cispo_clip);
      extremes[0] = std::min(extremes[0], m.clip_low_min);
      extremes[1] = std::max(extremes[1], m.clip_high_max);
    }
    step_sum_.AllReduce(sums.data(), sums.size(), "grpo step sums");
    std::vector<double> all_extremes(2 * ranks_);
    trainer_.comm().AllGatherDouble(extremes, all_extremes.data(), 2,
                                    "grpo clip extremes all-gather");
    std::vector<double> sum(kStepSums);
    for (size_t k = 0; k < kStepSums; ++k)
      sum[k] = sums[kStepSums + k] != 0 ? std::nan("") : FixedToDouble(sums[k]);
    if (s_.average_entropy) sum[kEntropy] /= ranks_;  // test only: SUM -> AVG
    if (s_.average_loss_sums)                         // test only: SUM -> AVG
      for (size_t k = kLoss; k <= kCispoClip; ++k) sum[k] /= ranks_;

    const double n = static_cast<double>(total_);
    reward_mean_ = sum[kRewards] / n;
    // The sample standard deviation (Bessel's correction) from the exact sums Σ r and Σ r².
    reward_std_ = total_ > 1
                      ? std::sqrt(std::max(
                            0.0, (sum[kRewardSquares] - sum[kRewards] * reward_mean_) / (n - 1)))
                      : 0.0;
    accuracy_ = sum[kCorrect] / n;
    format_rate_ = sum[kFormatOk] / n;
    truncated_rate_ = sum[kTruncated] / n;
    completion_length_ = totals_.tokens / n;
    entropy_mean_ = totals_.tokens > 0 ? sum[kEntropy] / totals_.tokens : 0.0;
    sums_ = GrpoLossSums();
    sums_.loss = sum[kLoss], sums_.tokens = sum[kLossTokens], sums_.kl = sum[kKl];
    sums_.ratio = sum[kRatio], sums_.clip_counted = sum[kClipCounted];
    sums_.clip_low = sum[kClipLow], sums_.clip_high = sum[kClipHigh];
    sums_.clip_region = sum[kClipRegion], sums_.cispo_clip = sum[kCispoClip];
    for (int r = 0; r < ranks_; ++r) {
      sums_.clip_low_min = std::min(sums_.clip_low_min, all_extremes[2 * r]);
      sums_.clip_high_max = std::max(sums_.clip_high_max, all_extremes[2 * r + 1]);
    }
  }

  Trainer& trainer_;
  GrpoSettings s_;
  std::shared_ptr<const ModelSpec> spec_;  // the policy's inference path
  uint64_t seed_ = 0;
  int64_t seq_len_ = 0, micro_batch_ = 1;
  int ranks_ = 1, rank_ = 0;
  int64_t total_ = 0, local_ = 0, first_ = 0;  // completions per step, this rank's, its first
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<PromptItem> prompts_;
  ChatTokens chat_tokens_;    // grpo.chat_template's bos and eos tokens
  int64_t end_of_turn_ = -1;  // its end-of-turn marker's id
  Batch batch_;
  std::vector<float> mask_, old_logp_, ref_logp_, logp_, dloss_, entropy_;
  std::vector<double> entropy_sums_;     // this rank's completions' entropy sums
  std::vector<GrpoLossSums> loss_sums_;  // this rank's micro-batches' loss sums
  ExactGroupSum step_sum_;               // every sum of ReduceTotals and ReduceStep
  std::vector<double> advantages_;       // of this rank's rows
  std::vector<int64_t> order_;           // the step's completions in training order (BuildBatch)
  int64_t trained_positions_ = 0;        // the step's micro-batches' rows x lengths, all ranks
  // Every completion of the rollout batch, on every rank, in completion order: its row (prompt
  // + completion tokens), prompt length, reward and flags; with keep_batch_ also the old and
  // reference log-probabilities of every row (what a checkpoint inside the batch holds).
  std::vector<std::vector<int32_t>> rows_;
  std::vector<int64_t> prompt_lengths_;
  std::vector<double> rewards_, correct_, format_ok_, lengths_, truncated_;
  std::vector<float> all_old_logp_, all_ref_logp_;
  bool keep_batch_ = false;      // grpo.iterations > 1 and checkpoints enabled
  bool first_iteration_ = true;  // the step is its rollout batch's first optimizer step
  nlohmann::json reference_;     // {"source", "xxh3"} of the initial weights
  nlohmann::json restored_;      // a resumed checkpoint's batch, until Next restores it
  std::string restored_where_;   // its state.json, for messages
  GrpoBatchTotals totals_;
  GrpoLossSums sums_;
  double reward_mean_ = 0, reward_std_ = 0, accuracy_ = 0, format_rate_ = 0, truncated_rate_ = 0;
  double completion_length_ = 0, entropy_mean_ = 0;
  double generation_seconds_ = 0, reward_seconds_ = 0, score_seconds_ = 0;
  Timer train_timer_;
};

}  // namespace

int RunGrpo(Config config, const std::string& resume_mode) {
  config.Validate();
  const GrpoSettings settings = ReadSettings(config);
  if (!settings.prompts_path.empty() && !FileExists(settings.prompts_path))
    throw UsageError("grpo.prompts = \"" + settings.prompts_path + "\": no such file");
  const int64_t global = settings.prompts_per_step * settings.group_size;
  if (config.IsSet("training.global_batch_size") &&
      config.Int("training.global_batch_size") != global)
    throw UsageError(StrFormat(
        "training.global_batch_size = %lld: crucible grpo sets it to grpo.prompts_per_step x "
        "grpo.group_size = %lld (leave it unset)",
        (long long)config.Int("training.global_batch_size"), (long long)global));
  config.Set("training.global_batch_size", global);
  const int64_t steps = config.Int("training.steps");
  if (steps % settings.iterations != 0)
    throw UsageError(StrFormat(
        "training.steps = %lld is not a multiple of grpo.iterations = %lld (training.steps "
        "counts optimizer steps, grpo.iterations of them per rollout batch)",
        (long long)steps, (long long)settings.iterations));
  if (config.Float("model.aux_loss_alpha") > 0)
    throw UsageError(
        "model.aux_loss_alpha > 0: crucible grpo's loss normaliser is 1 (its weights carry the "
        "aggregation), which would scale the balance loss by the batch's tokens; set it to 0 "
        "(the balance bias, model.bias_update_speed, still works)");
  const int64_t seq_len = config.Int("training.seq_len");
  Trainer trainer(std::move(config), resume_mode, std::make_unique<RolloutPlaceholder>(seq_len),
                  /*whole_logits=*/true);  // GrpoBatches weighs from the forward
  GrpoBatches batches(trainer, settings);
  trainer.SetStepBatches(&batches);
  if (trainer.leader())
    PrintLine(StrFormat(
        "phase=grpo task=%s group_size=%lld prompts_per_step=%lld completions_per_rank=%lld "
        "max_new_tokens=%lld iterations=%lld loss_type=%s beta=%g",
        settings.command ? "command" : RewardTaskName(settings.task),
        (long long)settings.group_size, (long long)settings.prompts_per_step,
        (long long)(global / trainer.comm().size()), (long long)settings.max_new_tokens,
        (long long)settings.iterations, GrpoLossTypeName(settings.loss.loss_type),
        settings.loss.beta));
  return trainer.Run();
}

}  // namespace crucible
