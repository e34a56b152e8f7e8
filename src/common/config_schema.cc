// The schema of every config key: section.name, type, default, help, valid range. One table for
// the whole program, so `crucible config keys`, validation and the resolved config agree.
#include "common/config.h"

namespace crucible {

using T = ConfigType;
using V = ConfigValue;

namespace {
// Valid ranges of numeric keys.
ConfigRange AtLeast(double min) {
  return {min, HUGE_VAL, false, false};
}
ConfigRange Above(double min) {
  return {min, HUGE_VAL, true, false};
}
ConfigRange Closed(double min, double max) {
  return {min, max, false, false};
}
ConfigRange HalfOpen(double min, double max) {  // [min, max)
  return {min, max, false, true};
}
// Model dimensions (0 takes the flavor's) and per-micro-batch sizes: the kernels pass them to
// BLAS as int.
const ConfigRange kDimension = Closed(0, 2147483647.0);
const ConfigRange kPositiveSize = Closed(1, 2147483647.0);
// The smallest normal float32 (FLT_MIN): an epsilon the kernels use in float32 must stay
// positive there.
constexpr double kFloat32Min = 1.1754943508222875e-38;
const ConfigRange kAny = {};
}  // namespace

const std::vector<ConfigKeySpec>& Config::Schema() {
  static const std::vector<ConfigKeySpec> schema = {
      // [job]
      {"job.name", T::kString, V(std::string("crucible")), "name of the run"},
      {"job.description", T::kString, V(std::string("")), "free text kept with the run"},
      {"job.dump_folder", T::kString, V(std::string("")),
       "run directory; empty means runs/<job.name>"},

      // [model]
      {"model.name", T::kString, V(std::string("llama")),
       "model family: llama, or deepseek_v3 (MLA + mixture of experts)", true},
      {"model.flavor", T::kString, V(std::string("debug")),
       "size preset; llama: debug (~1M params), tiny (~5M), small (~25M), base (~125M), 1b "
       "(~1.1B); deepseek_v3: debug (~1M total), small (~61M total, ~23M active), base (~122M "
       "total, ~79M active) (`crucible model info`)",
       true},
      {"model.vocab_size", T::kInt, V(int64_t{0}), "vocabulary size; 0 takes the flavor's", true,
       kDimension},
      {"model.dim", T::kInt, V(int64_t{0}), "hidden size; 0 takes the flavor's", true, kDimension},
      {"model.n_layers", T::kInt, V(int64_t{0}), "decoder layers; 0 takes the flavor's", true,
       kDimension},
      {"model.n_heads", T::kInt, V(int64_t{0}), "attention heads; 0 takes the flavor's", true,
       kDimension},
      {"model.n_kv_heads", T::kInt, V(int64_t{0}),
       "key/value heads (grouped-query attention); 0 takes the flavor's", true, kDimension},
      {"model.ffn_hidden_dim", T::kInt, V(int64_t{0}), "SwiGLU hidden size; 0 takes the flavor's",
       true, kDimension},
      {"model.tie_embeddings", T::kBoolOrString, V(std::string("flavor")),
       "share the input embedding with the output head: true, false, or flavor", true},
      {"model.rope_theta", T::kFloat, V(10000.0), "rotary embedding base", true, Above(0)},
      {"model.norm_eps", T::kFloat, V(1e-5), "RMSNorm epsilon (float32)", true,
       AtLeast(kFloat32Min)},
      {"model.init_std", T::kFloat, V(0.02), "standard deviation of the weight init", true,
       Above(0)},
      // [model] keys of model.name = "deepseek_v3" (model/deepseek_v3.h); transformers' names.
      {"model.q_lora_rank", T::kInt, V(int64_t{-1}),
       "deepseek_v3: query compression rank, 0 for none (q_proj); -1 takes the flavor's", true,
       Closed(-1, 2147483647.0)},
      {"model.kv_lora_rank", T::kInt, V(int64_t{0}),
       "deepseek_v3: key/value latent rank; 0 takes the flavor's", true, kDimension},
      {"model.qk_nope_head_dim", T::kInt, V(int64_t{0}),
       "deepseek_v3: query/key head dimensions without RoPE; 0 takes the flavor's", true,
       kDimension},
      {"model.qk_rope_head_dim", T::kInt, V(int64_t{0}),
       "deepseek_v3: query/key head dimensions with RoPE (decoupled); 0 takes the flavor's", true,
       kDimension},
      {"model.v_head_dim", T::kInt, V(int64_t{0}),
       "deepseek_v3: value head dimension; 0 takes the flavor's", true, kDimension},
      {"model.n_routed_experts", T::kInt, V(int64_t{0}),
       "deepseek_v3: routed experts per MoE layer; 0 takes the flavor's", true, kDimension},
      {"model.n_shared_experts", T::kInt, V(int64_t{-1}),
       "deepseek_v3: shared experts (0 for none); -1 takes the flavor's", true,
       Closed(-1, 2147483647.0)},
      {"model.num_experts_per_tok", T::kInt, V(int64_t{0}),
       "deepseek_v3: routed experts each token goes to (top-k); 0 takes the flavor's", true,
       kDimension},
      {"model.moe_intermediate_size", T::kInt, V(int64_t{0}),
       "deepseek_v3: SwiGLU hidden size of one expert; 0 takes the flavor's", true, kDimension},
      {"model.n_group", T::kInt, V(int64_t{0}),
       "deepseek_v3: groups of routed experts for grouped routing; 0 takes the flavor's", true,
       kDimension},
      {"model.topk_group", T::kInt, V(int64_t{0}),
       "deepseek_v3: groups a token's experts may come from; 0 takes the flavor's", true,
       kDimension},
      {"model.routed_scaling_factor", T::kFloat, V(0.0),
       "deepseek_v3: scale of the routed experts' weights; 0 takes the flavor's", true, AtLeast(0)},
      {"model.norm_topk_prob", T::kBoolOrString, V(std::string("flavor")),
       "deepseek_v3: normalise the top-k weights to sum to 1: true, false, or flavor", true},
      {"model.bias_update_speed", T::kFloat, V(0.001),
       "deepseek_v3: step of the auxiliary-loss-free balance bias per optimizer step "
       "(DeepSeek-V3's gamma); 0 keeps the bias at 0",
       true, AtLeast(0)},
      {"model.aux_loss_alpha", T::kFloat, V(0.0),
       "deepseek_v3: coefficient of the sequence-wise balance loss (DeepSeek-V3's alpha, "
       "which it set to 0.0001); 0 leaves it out",
       true, AtLeast(0)},
      {"model.first_k_dense_replace", T::kInt, V(int64_t{-1}),
       "deepseek_v3: leading layers with a dense MLP instead of experts; -1 takes the flavor's",
       true, Closed(-1, 2147483647.0)},
      {"model.init_weights", T::kString, V(std::string("")),
       "safetensors file (Hugging Face Llama names) to initialise the weights from", true},
      {"model.tokenizer_path", T::kString, V(std::string("")), "tokenizer.json of the data", true},

      // [training]
      {"training.steps", T::kInt, V(int64_t{100}), "optimizer steps to train", false, AtLeast(0)},
      {"training.seq_len", T::kInt, V(int64_t{256}), "tokens per sample", true, kPositiveSize},
      {"training.local_batch_size", T::kInt, V(int64_t{8}), "samples per micro-batch on one rank",
       true, kPositiveSize},
      {"training.global_batch_size", T::kInt, V(int64_t{0}),
       "samples per optimizer step over all ranks; 0 means local_batch_size x ranks "
       "(more than that accumulates gradients over micro-batches)",
       true, AtLeast(0)},
      {"training.max_norm", T::kFloat, V(1.0), "global gradient-norm clip; 0 disables", true,
       AtLeast(0)},
      {"training.batch_ramp", T::kStringList, V(std::vector<std::string>{}),
       "batch-size ramp: stages \"<batch>@<start>\" in order, <batch> n x global_batch_size "
       "(\"4x\") or samples (\"64\"), <start> a step (\"100\") or a token count "
       "(\"20000tokens\"); each stage raises gradient accumulation; empty: no ramp",
       true},
      {"training.batch_ramp_lr", T::kString, V(std::string("constant")),
       "how the LR follows the ramp: constant, linear (x batch / base) or sqrt", true},
      {"training.max_consecutive_skips", T::kInt, V(int64_t{10}),
       "stop with exit 3 after this many skipped updates in a row (non-finite losses or "
       "gradients, spikes); 0 never stops",
       false, AtLeast(0)},
      {"training.spike_skip", T::kString, V(std::string("off")),
       "skip the update when this is a spike: off, loss or grad_norm", false},
      {"training.spike_window", T::kInt, V(int64_t{50}),
       "the spike skipper's window: the last this many accepted steps", false, AtLeast(2)},
      {"training.spike_warmup", T::kInt, V(int64_t{20}),
       "the spike skipper arms once its window holds this many accepted steps", false, AtLeast(2)},
      {"training.spike_k", T::kFloat, V(6.0),
       "a spike is more than this many standard deviations above the window's mean", false,
       Above(0)},
      {"training.spike_limit", T::kInt, V(int64_t{5}),
       "stop with exit 3 after this many spikes in a row; 0 never stops", false, AtLeast(0)},
      {"training.grad_norm_rise_warn", T::kFloat, V(0.0),
       "warn when the gradient norm rises more than this factor in one step; 0 disables", false,
       AtLeast(0)},
      {"training.device", T::kString, V(std::string("cpu")),
       "where the model computes: cpu, or cuda (the GPU LOCAL_RANK picks; a build with the CUDA "
       "toolkit); a checkpoint resumes on either (the files are the same)",
       false},
      {"training.mixed_precision_param", T::kString, V(std::string("float32")),
       "precision of the operands of the matrix products and attention: float32, or bfloat16 "
       "(rounded to bf16, accumulated in float32; master weights and optimizer state stay float32)",
       true},
      {"training.mixed_precision_reduce", T::kString, V(std::string("float32")),
       "precision of the gradient reductions: float32 (they are exact sums, see "
       "docs/distributed.md)",
       true},
      {"training.master_dtype", T::kString, V(std::string("float32")),
       "storage of the master weights: float32, or bfloat16 (emulated: rounded after every "
       "update; small updates are lost, see the frozen-parameter detector)",
       true},
      {"training.dataset", T::kString, V(std::string("synthetic")),
       "input: synthetic (seeded random tokens), tokens (a flat file of token ids), blend (a "
       "blendcorpus file list of prepared shards, see docs/data.md) or sft (a .jsonl file of "
       "conversations, see docs/post-training.md)",
       true},
      {"training.dataset_path", T::kString, V(std::string("")), "file the dataset reads", true},
      {"training.data_cache_dir", T::kString, V(std::string("")),
       "blend index cache; empty means <file list folder>/.crucible-cache"},
      {"training.token_dtype", T::kString, V(std::string("uint16")),
       "element type of a flat token file: uint16 or uint32", true},

      // [data]
      {"data.stages", T::kTableList, V(std::vector<std::string>{}),
       "training stages in order, each a [[data.stages]] table: list (a blend file list) or "
       "blends (a blend of them, [{ list, weight }, ...]), steps "
       "or tokens, lr_policy (continue, rewarm, gentle), warmup_steps, peak_fraction (gentle), "
       "anneal_steps, name; needs training.dataset = \"blend\" (docs/training.md#stages)",
       true},

      // [optimizer]
      {"optimizer.name", T::kString, V(std::string("AdamW")),
       "AdamW, SGD, Lion, SophiaG, Muon, Mano or Mano_v2", true},
      {"optimizer.lr", T::kFloat, V(3e-4), "peak learning rate", true, AtLeast(0)},
      {"optimizer.beta1", T::kFloat, V(0.9), "first-moment decay (SGD: momentum)", true,
       HalfOpen(0, 1)},
      {"optimizer.beta2", T::kFloat, V(0.95),
       "second-moment decay (Lion: its momentum's decay; the Lion paper's is 0.99)", true,
       HalfOpen(0, 1)},
      {"optimizer.eps", T::kFloat, V(1e-8), "AdamW epsilon; Mano's and Mano_v2's (float32)", true,
       AtLeast(kFloat32Min)},
      {"optimizer.weight_decay", T::kFloat, V(0.1), "decoupled weight decay", true, AtLeast(0)},
      {"optimizer.decay_norms", T::kBool, V(false), "apply weight decay to norm weights too", true},
      {"optimizer.decay_embeddings", T::kBool, V(false),
       "apply weight decay to the embedding table too", true},
      // Muon and Mano train the hidden matrices; AdamW trains the rest (docs/optimizers.md).
      {"optimizer.adamw_lr", T::kFloat, V(0.0),
       "Muon/Mano: peak LR of AdamW's groups (embeddings, head, norms); 0: optimizer.lr", true,
       AtLeast(0)},
      {"optimizer.adamw_beta1", T::kFloat, V(0.9), "Muon/Mano: AdamW's beta1", true,
       HalfOpen(0, 1)},
      {"optimizer.adamw_beta2", T::kFloat, V(0.95), "Muon/Mano: AdamW's beta2", true,
       HalfOpen(0, 1)},
      {"optimizer.adamw_eps", T::kFloat, V(1e-8), "Muon/Mano: AdamW's epsilon", true,
       AtLeast(kFloat32Min)},
      {"optimizer.adamw_weight_decay", T::kFloat, V(0.1),
       "Muon/Mano: AdamW's decoupled weight decay (decay_norms/decay_embeddings apply)", true,
       AtLeast(0)},
      {"optimizer.ns_steps", T::kInt, V(int64_t{5}), "Muon: Newton-Schulz iterations", true,
       Closed(1, 100)},
      {"optimizer.ns_precision", T::kString, V(std::string("fp32")),
       "Muon: Newton-Schulz in fp32, or bf16 (emulated exactly: bf16 values, fp32 sums)", true},
      {"optimizer.ns_warn_max", T::kFloat, V(100.0),
       "Muon: warn when a Newton-Schulz iterate has an entry above this (or non-finite)", false,
       AtLeast(0)},
      {"optimizer.muon_scale", T::kString, V(std::string("moonlight")),
       "Muon: update scale, moonlight (0.2 sqrt(max(m, n))) or keller (sqrt(max(1, m/n)))", true},
      {"optimizer.muon_nesterov", T::kBool, V(true), "Muon: Nesterov momentum", true},
      {"optimizer.mano_nesterov", T::kBool, V(false),
       "Mano: Nesterov momentum (off, as the paper and the official mano.py)", true},
      {"optimizer.mano_v2_nesterov", T::kBool, V(true),
       "Mano_v2: Nesterov momentum (on, as the official mano_v2.py)", true},
      {"optimizer.sophia_k", T::kInt, V(int64_t{10}),
       "SophiaG: steps between Hessian estimates (an extra forward and backward pass)", true,
       kPositiveSize},
      {"optimizer.sophia_rho", T::kFloat, V(0.04), "SophiaG: clipping scale rho", true,
       AtLeast(kFloat32Min)},
      {"optimizer.sophia_clip_warn", T::kFloat, V(0.9),
       "SophiaG: warn when more than this fraction of coordinates is clipped", true, Closed(0, 1)},

      // [lr_scheduler]
      {"lr_scheduler.warmup_steps", T::kInt, V(int64_t{10}), "linear warmup steps", true,
       AtLeast(0)},
      {"lr_scheduler.decay_type", T::kString, V(std::string("cosine")),
       "after warmup: constant, linear, cosine or wsd (stable, then linear decay)", true},
      {"lr_scheduler.decay_ratio", T::kFloat, V(0.2),
       "wsd: fraction of all steps spent in the final decay", true, Closed(0, 1)},
      {"lr_scheduler.min_lr_factor", T::kFloat, V(0.1),
       "floor of the decay as a fraction of the peak learning rate", true, Closed(0, 1)},

      // [checkpoint]
      {"checkpoint.enable", T::kBool, V(true),
       "save checkpoints (every `interval` steps, at the last step, on SIGTERM/SIGUSR1) and the "
       "final weights model.safetensors in the run directory; false writes neither"},
      {"checkpoint.folder", T::kString, V(std::string("ckpt")),
       "checkpoint folder, relative to the run directory (or absolute)"},
      {"checkpoint.interval", T::kIntOrString, V(int64_t{500}),
       "steps between checkpoints, or \"auto\": Young/Daly sqrt(2 x save stall x MTBF)", false,
       AtLeast(1)},
      {"checkpoint.async", T::kBool, V(true),
       "copy the state to host memory and write it on a background thread"},
      {"checkpoint.keep_latest_k", T::kInt, V(int64_t{3}),
       "keep the newest k complete checkpoints (0 keeps all); older ones are pruned after a save",
       false, AtLeast(0)},
      {"checkpoint.keep_every_n", T::kInt, V(int64_t{0}),
       "also keep every checkpoint whose step is a multiple of n (0: none)", false, AtLeast(0)},
      {"checkpoint.mtbf_hours", T::kFloat, V(0.0),
       "mean time between failures for interval=\"auto\" when launch/attempts.jsonl shows none; "
       "0 assumes 24",
       false, AtLeast(0)},
      {"checkpoint.initial_load_hf", T::kString, V(std::string("")),
       "Hugging Face Llama folder (config.json + model.safetensors) to start training from"},

      // [metrics]
      {"metrics.log_freq", T::kInt, V(int64_t{1}), "print a progress line every N steps", false,
       AtLeast(1)},
      {"metrics.enable_jsonl", T::kBool, V(true), "write metrics.jsonl in the run directory"},
      {"metrics.enable_tensorboard", T::kBool, V(false),
       "rank 0 also writes TensorBoard event files (every metrics.jsonl number, validation, the "
       "config as text) to save_tb_folder"},
      {"metrics.save_tb_folder", T::kString, V(std::string("tb")),
       "TensorBoard folder, relative to the run directory (or absolute)"},
      {"metrics.peak_gflops", T::kFloat, V(0.0),
       "peak fp32 GFLOP/s of one rank for MFU; 0: the machine's GEMM ceiling for the model's "
       "shapes, "
       "measured once and cached in ~/.cache/crucible/gemm-ceiling.json",
       false, AtLeast(0)},
      {"metrics.remeasure_peak", T::kBool, V(false),
       "measure the GEMM ceiling again although it is cached; the cache keeps the higher of the "
       "two (a ceiling measured while the machine was slower reads every MFU too high)"},
      {"metrics.per_rank", T::kBool, V(false),
       "with several ranks, every rank also writes metrics-rank<r>.jsonl (its loss share, time)"},
      {"metrics.profile", T::kBool, V(false),
       "time every kernel and print phase=profile lines (per-kernel share) at the end"},

      // [validation]
      {"validation.enable", T::kBool, V(false), "evaluate during training"},
      {"validation.freq", T::kInt, V(int64_t{100}), "evaluate every N steps (and after the last)",
       false, AtLeast(1)},
      {"validation.tasks", T::kStringList, V(std::vector<std::string>{}),
       "multiple-choice task files (lm-eval JSONL shapes, see docs/eval.md)"},
      {"validation.held_out", T::kString, V(std::string("")),
       "held-out text (.jsonl of {\"text\"} or plain text) for loss and bits per byte"},
      {"validation.steps", T::kInt, V(int64_t{0}),
       "items per task and held-out documents per evaluation; 0 means all", false, AtLeast(0)},
      {"validation.gate_after_steps", T::kInt, V(int64_t{0}),
       "eval gate: from this step on, a task still at chance within its standard error is "
       "reported (0 disables)",
       false, AtLeast(0)},
      {"validation.gate_action", T::kString, V(std::string("warn")),
       "what the eval gate does: warn, or stop (exit 2)"},

      // [stage_eval] (a run in stages: an evaluation at every boundary, docs/training.md#stages)
      {"stage_eval.tasks", T::kStringList, V(std::vector<std::string>{}),
       "multiple-choice task files evaluated at every stage boundary (docs/eval.md shapes)"},
      {"stage_eval.text", T::kStringList, V(std::vector<std::string>{}),
       "held-out text files evaluated at every stage boundary (loss, bits per byte), with each "
       "stage's eval_text"},
      {"stage_eval.items", T::kInt, V(int64_t{0}),
       "items per task and documents per text file at each boundary; 0 means all", false,
       AtLeast(0)},
      {"stage_eval.gate_tasks", T::kStringList, V(std::vector<std::string>{}),
       "stage gate: tasks (by name, file name without .jsonl) whose accuracy a stage may not "
       "lose; empty: no gate"},
      {"stage_eval.gate_metric", T::kString, V(std::string("acc")),
       "what the stage gate compares: acc or acc_norm"},
      {"stage_eval.gate_margin", T::kFloat, V(0.05),
       "stage gate: stop (exit 3) when a gated task's accuracy after a stage is below its value "
       "before the stage minus this (absolute; negative demands a gain)",
       false, Closed(-1, 1)},

      // [sft] (training.dataset = "sft": conversations, docs/post-training.md)
      {"sft.chat_template", T::kString, V(std::string("")),
       "chat template the conversations are rendered with: llama3, chatml or deepseek-v3 (also "
       "the default of export hf --chat-template and generate --chat)",
       true},
      {"sft.overlong", T::kString, V(std::string("truncate")),
       "a conversation longer than seq_len + 1 tokens: truncate (keep its first seq_len + 1) or "
       "skip (counted and reported either way)",
       true},
      {"sft.packing", T::kBool, V(false),
       "pack several conversations into each sample (first fit, in the shuffled order); "
       "attention stays inside each conversation and positions restart at its start",
       true},

      // [grpo] (crucible grpo: on-policy RL with verifiable rewards, docs/post-training.md)
      {"grpo.task", T::kString, V(std::string("sum_digits")),
       "reward: sum_digits or addition (built-in, checked against the answer), or command "
       "(grpo.reward_command)",
       true},
      {"grpo.prompts", T::kString, V(std::string("")),
       ".jsonl of {\"prompt\": ..., optional \"answer\" and other fields}; empty: built-in "
       "tasks generate their prompts from debug.seed",
       true},
      {"grpo.reward_command", T::kString, V(std::string("")),
       "grpo.task = command: a shell command, completions as jsonl on stdin, one reward per line "
       "on stdout",
       true},
      {"grpo.reward_timeout_seconds", T::kFloat, V(60.0),
       "the reward command's time limit per step (0: none)", false, AtLeast(0)},
      {"grpo.group_size", T::kInt, V(int64_t{4}), "completions sampled per prompt (G)", true,
       Closed(1, 2147483647.0)},
      {"grpo.prompts_per_step", T::kInt, V(int64_t{2}),
       "prompts per rollout batch (global; x group_size = training.global_batch_size)", true,
       Closed(1, 2147483647.0)},
      {"grpo.max_new_tokens", T::kInt, V(int64_t{32}), "completion tokens at most", true,
       Closed(1, 2147483647.0)},
      {"grpo.temperature", T::kFloat, V(1.0), "sampling temperature (> 0)", true, Above(0)},
      {"grpo.top_p", T::kFloat, V(1.0), "sampling top-p (1: off)", true, Closed(0, 1)},
      {"grpo.top_k", T::kInt, V(int64_t{0}), "sampling top-k (0: off)", true, AtLeast(0)},
      {"grpo.iterations", T::kInt, V(int64_t{1}),
       "optimizer steps per rollout batch (TRL's num_iterations); training.steps counts "
       "optimizer steps",
       true, Closed(1, 2147483647.0)},
      {"grpo.loss_type", T::kString, V(std::string("dapo")),
       "TRL's loss_type: grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo or vespo", true},
      {"grpo.scale_rewards", T::kString, V(std::string("group")),
       "advantage scaling (TRL's scale_rewards): group, batch or none", true},
      {"grpo.beta", T::kFloat, V(0.0),
       "KL coefficient to the frozen initial weights (0: no reference model)", true, AtLeast(0)},
      {"grpo.epsilon", T::kFloat, V(0.2), "lower clip range (TRL's epsilon)", true, AtLeast(0)},
      {"grpo.epsilon_high", T::kFloat, V(-1.0),
       "upper clip range (TRL's epsilon_high; negative: grpo.epsilon)", true, AtLeast(-1)},
      {"grpo.chat_template", T::kString, V(std::string("")),
       "render each prompt as one user turn of this chat template (llama3, chatml or "
       "deepseek-v3) with the generation prompt; its end-of-turn marker ends a completion; "
       "empty: plain text",
       true},
      {"grpo.importance_sampling_level", T::kString, V(std::string("token")),
       "token, or sequence (GSPO)", true},

      // [parallelism]
      {"parallelism.zero_stage", T::kInt, V(int64_t{1}),
       "0: replicate optimizer state; 1: shard it over the data-parallel ranks (ZeRO-1); 3: "
       "shard parameters, gradients and optimizer state, gathering each layer when it is needed "
       "(ZeRO-3, the FSDP equivalent)",
       false, Closed(0, 3)},
      {"parallelism.tensor_parallel_degree", T::kInt, V(int64_t{1}),
       "ranks that share each layer's tensors (Megatron-style tensor parallelism, consecutive "
       "ranks, one node); the data-parallel degree is the ranks / this (docs/parallelism.md)",
       false, AtLeast(1)},
      {"parallelism.tensor_parallel_chunks", T::kInt, V(int64_t{0}),
       "every dimension tensor parallelism splits is cut into this many chunks, computed and "
       "summed in one order at every degree: runs with the same chunks give the same bits at any "
       "tensor_parallel_degree that divides them (0: the degree; 1: the plain model)",
       false, AtLeast(0)},
      {"parallelism.expert_parallel_degree", T::kInt, V(int64_t{1}),
       "ranks of each data-parallel group that split a mixture of experts' routed experts "
       "between them (consecutive ranks); each rank routes its tokens, which travel to their "
       "experts' ranks and back by all-to-all; the same bits at every degree "
       "(docs/parallelism.md)",
       false, AtLeast(1)},
      {"parallelism.sequence_parallel", T::kBool, V(false),
       "split the residual stream and the norms of a tensor-parallel model along the rows of a "
       "micro-batch over the group (Megatron's sequence parallelism): less activation memory, "
       "the same bits; training.seq_len must divide into the tensor-parallel chunks"},
      {"parallelism.exact_reduction", T::kString, V(std::string("block48")),
       "format of the exact gradient sums: block48 (each block of 256 values of a micro-batch "
       "rounded to 24 bits below its largest, 6 bytes a value on the wire), block32 (17 bits, 4 "
       "bytes) or fixed128 (every value at 2^-64, 16 bytes); the same bits on any number of "
       "ranks and at every tensor-parallel degree in each (docs/distributed.md)"},
      {"parallelism.overlap_grad_reduce", T::kBool, V(true),
       "start each layer's gradient reduction (non-blocking) while the backward pass goes on "
       "with the layers below"},
      {"parallelism.consistency_check_steps", T::kInt, V(int64_t{50}),
       "every N steps the ranks compare a hash of their parameters (under ZeRO-3: of every "
       "layer they gathered since the last check) to catch silent data corruption; 0 disables",
       false, AtLeast(0)},

      // [comm]
      {"comm.train_timeout_seconds", T::kFloat, V(600.0),
       "a rank waiting longer than this in a collective aborts the job, naming the collective",
       false, Above(0)},

      // [debug]
      {"debug.seed", T::kInt, V(int64_t{0}), "seed of weight init and synthetic data", true, kAny},
      {"debug.detectors", T::kBool, V(true),
       "silent-bug detectors: frozen parameters, step-1 loss vs ln(vocab), non-finite gradients"},
      {"debug.portable_exact", T::kBool, V(false),
       "run every kernel and the host math in the portable fixed-order form (compute/portable/): "
       "the same bits on every device, slowly (crucible smoke --portable)",
       true},
      {"debug.share_gpu", T::kBool, V(false),
       "test only: ranks on a node with more ranks than GPUs share them (GPU = local rank modulo "
       "the GPU count) instead of being refused"},
      {"debug.frozen_steps", T::kInt, V(int64_t{20}),
       "warn when a parameter tensor is unchanged for this many consecutive steps; 0 disables",
       false, AtLeast(0)},
      {"debug.dead_expert_steps", T::kInt, V(int64_t{20}),
       "warn when a routed expert receives no token for this many consecutive steps; 0 disables",
       false, AtLeast(0)},
      {"debug.initial_loss_tolerance", T::kFloat, V(0.5),
       "warn when a fresh model's step-1 loss is further than this from ln(vocab_size)", false,
       AtLeast(0)},
      {"debug.grpo_average_reduction", T::kString, V(std::string("")),
       "test only: crucible grpo averages this cross-rank sum over the ranks instead of summing "
       "it (loss_sums: the GRPO loss sums; entropy: the entropy sum), so the GRPO smoke gate "
       "(crucible smoke --grpo --ranks 2) must catch it; one rank cannot (its average is the "
       "sum); empty: off",
       false},
      {"debug.fake_loss_divisor", T::kFloat, V(1.0),
       "test only: divide the logged loss by this (emulates a loss divided by the DP size)", false,
       Above(0)},
      {"debug.dump_gradients_step", T::kInt, V(int64_t{0}),
       "write the reduced gradient of this step (before clipping) to "
       "gradients-step-<N>.f32 in the run directory, float32 in table order (one rank only; "
       "bench/exact_reduction_error.py)",
       false, AtLeast(0)},
      {"debug.inject_nan_step", T::kInt, V(int64_t{0}),
       "test only: put a NaN into the gradient of debug.inject_nan_tensor at this step", false,
       AtLeast(0)},
      {"debug.inject_nan_tensor", T::kString, V(std::string("model.norm.weight")),
       "test only: see debug.inject_nan_step"},
      {"debug.skip_steps", T::kString, V(std::string("")),
       "test only: skip the update of these steps (comma-separated), as a guard would"},
      {"debug.scale_loss_step", T::kInt, V(int64_t{0}),
       "test only: the loss the guards see at this step is multiplied by debug.scale_loss_factor",
       false, AtLeast(0)},
      {"debug.scale_loss_factor", T::kFloat, V(1.0), "test only: see debug.scale_loss_step", false,
       Above(0)},
      {"debug.bf16_path", T::kString, V(std::string("auto")),
       "bf16 compute on the CPU: auto (the linear layers on AMX-BF16, else AVX-512 BF16, where "
       "the CPU has it), emulated (the exact emulation everywhere), native (as auto, but an error "
       "where the CPU has neither), avx512_bf16 or amx (that kernel; an error where the CPU lacks "
       "it, under float32 too)",
       true},
      {"debug.gemm_library", T::kString, V(std::string("auto")),
       "the fp32 products' library on the CPU: auto (the measured table for this CPU's vector ISA "
       "and the product's shape), openblas, onednn (every product)",
       true},
      {"debug.corrupt_rank", T::kInt, V(int64_t{-1}),
       "test only: this rank flips one bit of its parameters at debug.corrupt_step", false,
       AtLeast(-1)},
      {"debug.corrupt_step", T::kInt, V(int64_t{0}), "test only: see debug.corrupt_rank", false,
       AtLeast(0)},
      {"debug.kill_rank", T::kInt, V(int64_t{-1}),
       "demo and tests: in a run that did not resume, this rank SIGKILLs itself before "
       "debug.kill_step, as a node that dies (make demo's recovery); -1 never",
       false, AtLeast(-1)},
      {"debug.kill_step", T::kInt, V(int64_t{0}), "demo and tests: see debug.kill_rank", false,
       AtLeast(0)},
  };
  return schema;
}

}  // namespace crucible
