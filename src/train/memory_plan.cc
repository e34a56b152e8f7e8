#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "distributed/data_parallel.h"
#include "distributed/param_access.h"
#include "optim/optimizer.h"
#include "optim/optimizer_shard.h"

namespace crucible {
namespace {

constexpr double kInt64Limit = 9223372036854775808.0;  // 2^63
constexpr double kIntLimit = 2147483647.0;             // what BLAS takes as a dimension

// Sizes up to a PiB as HumanBytes does, larger ones in scientific notation.
std::string Bytes(double bytes) {
  return bytes < std::ldexp(1.0, 50) ? HumanBytes(bytes) : StrFormat("%.3g bytes", bytes);
}

// A count exactly while a double holds it exactly, then in scientific notation.
std::string Count(double value) {
  return value < 1e15 ? StrFormat("%.0f", value) : StrFormat("%.3g", value);
}

// A number from a file such as memory.max; NaN when absent or not a number ("max").
double ReadNumber(const std::string& path) {
  if (!FileExists(path)) return std::nan("");
  try {
    const std::string text = Trim(ReadFile(path));
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    return end && end != text.c_str() && *end == '\0' ? value : std::nan("");
  } catch (const Error&) {
    return std::nan("");
  }
}

}  // namespace

MemoryPlan PlanMemory(const Config& config, const ModelSpec& model, const TrainingShape& shape,
                      int rank, int world, bool activations_on_host,
                      const ModelParallelism& parallelism) {
  // This rank's table (its parts under tensor parallelism) and the whole model's.
  const ParameterSizes sizes = model.PlannedSizes(parallelism), whole = model.PlannedSizes();
  const bool cut = parallelism.tp_degree > 1 || parallelism.ep_degree > 1;
  const double P = sizes.parameters, U = sizes.largest_unit;
  const double B = static_cast<double>(shape.micro_batch), T = static_cast<double>(shape.seq_len);
  // The layout of DataParallel: shards of whole norm chunks, buffers padded to ranks x shard.
  const double chunk = static_cast<double>(DataParallel::kNormChunk);
  const double shard = std::ceil(std::ceil(P / chunk) / world) * chunk;
  const double padded = shard * world;
  // The optimizer the trainer builds (Muon, Mano: with AdamW's state for the other groups).
  // Each state counts the tensors that carry it (StateSpec::carried_by), from the planned sizes:
  // a table of an absurd config would itself not fit.
  const std::shared_ptr<const Optimizer> optimizer = BuildOptimizerConfig(config).optimizer;
  std::vector<double> carried;   // elements of each per-element state over every parameter
  double tensor_floats = 0;      // floats of the per-tensor states (whole-matrix optimizers)
  double whole_state_bytes = 0;  // the per-element states of the whole model
  for (const StateSpec& spec : optimizer->state()) {
    double elements = 0, tensors = 0, whole_elements = 0;
    for (size_t kind = 0; kind < kParamKindCount; ++kind)
      if (spec.carried_by.Contains(static_cast<ParamKind>(kind))) {
        elements += sizes.kind_parameters[kind];
        tensors += sizes.kind_tensors[kind];
        whole_elements += whole.kind_parameters[kind];
      }
    if (spec.carried_by == ParamKinds::All())
      elements = P, tensors = sizes.tensors, whole_elements = whole.parameters;
    if (spec.per_tensor == 0) {
      carried.push_back(elements);
      whole_state_bytes += 4 * whole_elements;
    }
    tensor_floats += static_cast<double>(spec.per_tensor) * tensors;
  }
  // Per-tensor state, for every carrying tensor (a rank owns at most all of them).
  const double tensor_state = 4 * tensor_floats;
  // The elements whose state this rank keeps: all, its shard, or, for an optimizer that updates
  // whole matrices under ZeRO across ranks, the tensors it owns (at most the largest tensor
  // above an even share; a unit is at least as large) and, where it mixes the modes, the
  // elementwise tensors' parts in its range (at most its shard); each state is planned at that
  // bound or at its carrying elements, whichever is smaller; with
  // buffers for its range's pieces and its tensors' gradients and weights
  // (distributed/matrix_owner_optimizer.cc).
  const bool owners =
      optimizer->shard_mode() == ShardMode::kWholeMatrix && shape.zero_stage >= 1 && world > 1;
  const double update =
      shape.zero_stage == 0 ? P
      : owners              ? std::min(P, shard + U)
               : std::max(0.0, std::min(P, (rank + 1) * shard) - std::min(P, rank * shard));
  const double owner_buffers = owners ? 4 * (shard + 2 * update) : 0.0;
  // This rank's per-element state (at most the carrying elements of each), and every rank's.
  double state_bytes = 0, full_state_bytes = 0;
  for (double elements : carried) {
    state_bytes += 4 * std::min(elements, update);
    full_state_bytes += 4 * elements;
  }

  MemoryPlan plan;
  // Off the host (a GPU) the activations are the device's (CheckDeviceFits); the host keeps the
  // model's copies of the targets and the per-position losses.
  // The training forward keeps a chunk of the logits, not the whole (ForwardOptions::kFused); an
  // optimizer that samples targets from the logits (SophiaG's Hessian pass), or a StepBatches
  // whose loss weights come from the forward (GRPO: shape.whole_logits), keeps them whole.
  const BufferSizes buffers = model.PlannedBuffers(B, T, parallelism);
  const double whole_logits =
      shape.whole_logits || optimizer->hessian_interval() > 0 ? buffers.whole_logits_bytes : 0;
  plan.activations = activations_on_host ? buffers.total_bytes + whole_logits : 8 * B * T;
  // The loader holds two batches (the step's and the next, read ahead), each an int32 input and
  // target per position (and a float loss weight, for a weighted source), plus one sample.
  plan.batch = 2 * 12 * static_cast<double>(shape.accumulation) * B * T + 4 * (T + 1);
  if (shape.zero_stage == 3) {
    const double piece = std::min(static_cast<double>(DataParallel::kReducePiece), U);
    plan.model_state =
        (4 + 4 + 16) * shard + state_bytes + 4 * ShardedAccess::kGatherBuffers * U +
        4 * (sizes.first_unit + sizes.largest_other_unit) +
        16 * ShardedAccess::kReductionBuffers * (piece + std::max(1.0, std::min(piece, shard))) +
        owner_buffers + tensor_state +
        (parallelism.ep_degree > 1 ? 2 * 16 * sizes.largest_expert_block : 0.0);
  } else {
    const double receive =
        shape.zero_stage == 1 && shape.overlap
            ? 16.0 * DataParallel::kMaxInFlight *
                  std::max(1.0, std::min(static_cast<double>(DataParallel::kReducePiece), shard))
            : 0.0;
    // The exact accumulator's 16 bytes an element, except where one rank runs one micro-batch a
    // step: its gradients are rounded in place (distributed/exact_sum.h).
    const bool one_rank = world == 1 && parallelism.tp_degree == 1 && parallelism.ep_degree == 1;
    const double accumulator = one_rank && shape.accumulation == 1 ? 0.0 : 16 * padded;
    plan.model_state =
        (4 + 4) * padded + accumulator + state_bytes + receive + owner_buffers + tensor_state;
  }
  // Rank 0 of the job writes checkpoints: the host snapshot of the async writer, of the whole
  // model. During a save, data-parallel rank 0 (of each tensor-parallel rank) holds the full
  // optimizer state of its table (and under ZeRO-3 its full weights) gathered from the shards,
  // and under tensor parallelism rank 0 of the job the parts of every tensor-parallel rank and
  // the whole tensors they make up (the weights, and the states one at a time).
  const bool sharded_state = shape.zero_stage >= 1 && world > 1;
  const bool leader = rank == 0 && parallelism.tp_rank == 0 && parallelism.ep_rank == 0;
  // The ranks whose parts rank 0 puts together (tensor or expert parallelism's group).
  const double tp = static_cast<double>(std::max(parallelism.tp_degree, parallelism.ep_degree));
  if (config.Bool("checkpoint.enable")) {
    if (leader && config.Bool("checkpoint.async"))
      plan.checkpoint += 4 * whole.parameters + whole_state_bytes;
    if (rank == 0) {
      if (sharded_state) plan.checkpoint += full_state_bytes + 4 * padded;
      if (shape.zero_stage == 3 && world > 1) plan.checkpoint += 4 * padded;
    }
    if (leader && cut) plan.checkpoint += 4 * tp * P + 4 * whole.parameters + 2 * whole_state_bytes;
    if (sharded_state) plan.checkpoint += 4 * shard;
  }
  // ZeRO-3 fills one full buffer when it loads given weights, then keeps its shard.
  if (shape.zero_stage == 3 && (!config.String("model.init_weights").empty() ||
                                !config.String("checkpoint.initial_load_hf").empty()))
    plan.checkpoint += 4 * padded;
  return plan;
}

AvailableMemory MachineAvailableMemory() {
  AvailableMemory available{HUGE_VAL, "unknown"};
  if (FileExists("/proc/meminfo")) {
    for (const std::string& line : Split(ReadFile("/proc/meminfo"), '\n'))
      if (StartsWith(line, "MemAvailable:")) {
        available = {std::strtod(line.c_str() + 13, nullptr) * 1024.0,
                     "MemAvailable in /proc/meminfo"};
        break;
      }
  }
  // A cgroup limit below that (a container, a Slurm job): what is left under it.
  struct Limit {
    const char* limit;
    const char* usage;
    const char* name;
  };
  for (const Limit& l :
       {Limit{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "cgroup memory.max"},
        Limit{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
              "/sys/fs/cgroup/memory/memory.usage_in_bytes", "cgroup memory.limit_in_bytes"}}) {
    const double limit = ReadNumber(l.limit), usage = ReadNumber(l.usage);
    if (std::isfinite(limit) && std::isfinite(usage) && limit - usage < available.bytes)
      available = {std::max(0.0, limit - usage), StrFormat("%s minus usage", l.name)};
  }
  return available;
}

std::vector<std::string> CheckTrainingFits(const Config& config, const ModelSpec& model,
                                           const TrainingConfig& training, Communicator& comm,
                                           const ComputeBackend& backend,
                                           const ModelParallelism& parallelism) {
  // The loader's batches are the largest stage's (a batch ramp's last; the one global batch
  // without a ramp).
  TrainingShape shape = training.shape;
  shape.accumulation = training.max_accumulation();
  const double steps = static_cast<double>(training.steps);
  const double global_batch = static_cast<double>(training.batches.MaxGlobalBatch());
  const double B = static_cast<double>(shape.micro_batch), T = static_cast<double>(shape.seq_len);
  if (steps * global_batch * T >= kInt64Limit)
    throw UsageError(StrFormat(
        "training.steps x training.global_batch_size x training.seq_len = %.0f x %.0f x %.0f = "
        "%.3g tokens: more than a 64-bit count holds (9.2e18); lower them",
        steps, global_batch, T, steps * global_batch * T));

  // Rank r's plan: its data-parallel rank and its place in its tensor- or expert-parallel group
  // (the groups of either are consecutive ranks; the two are not combined).
  const int tp = parallelism.tp_degree, ep = parallelism.ep_degree, group = std::max(tp, ep);
  auto plan_of = [&](int r) {
    ModelParallelism layout = ModelParallelism::Layout(tp, r % tp, parallelism.tp_chunks);
    layout.sequence_parallel = parallelism.sequence_parallel;
    layout.ep_degree = ep;
    layout.ep_rank = r % ep;
    return PlanMemory(config, model, shape, r / group, comm.size() / group, backend.host_memory(),
                      layout);
  };
  // Ranks on one host share its memory.
  const MemoryPlan plan = plan_of(comm.rank());
  const AvailableMemory available = MachineAvailableMemory();
  const std::vector<std::string> hosts = comm.AllGatherString(comm.host(), "memory check");
  const double mine[2] = {plan.total(), available.bytes};
  std::vector<double> all(2 * comm.size());
  comm.AllGatherDouble(mine, all.data(), 2, "memory check");
  std::map<std::string, int> first_rank;  // of each host
  std::map<std::string, double> asked;
  std::map<std::string, int> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    first_rank.emplace(hosts[r], r);
    asked[hosts[r]] += all[2 * r];
    ++ranks[hosts[r]];
  }
  if (comm.rank() == 0)
    PrintLine(StrFormat(
        "phase=memory_check host=%s ranks_on_host=%d asked_bytes=%.0f available_bytes=%.0f "
        "available_source=\"%s\" activations_bytes=%.0f batch_bytes=%.0f model_state_bytes=%.0f "
        "checkpoint_bytes=%.0f",
        hosts[0].c_str(), ranks[hosts[0]], asked[hosts[0]], available.bytes,
        available.source.c_str(), plan.activations, plan.batch, plan.model_state, plan.checkpoint));
  for (int r = 0; r < comm.size(); ++r) {
    const std::string& host = hosts[r];
    const double host_available = all[2 * first_rank[host] + 1];
    if (first_rank[host] != r || asked[host] <= host_available) continue;
    // The parts of the first rank of that host (its ranks differ only in their shard, and rank
    // 0 in its checkpoint buffers); every rank computes the same message.
    const MemoryPlan p = plan_of(r);
    const double largest = std::max({p.activations, p.batch, p.model_state, p.checkpoint});
    const char* advice =
        largest == p.activations ? "lower training.local_batch_size or training.seq_len"
        : largest == p.batch     ? "lower training.global_batch_size"
                                 : "choose a smaller model (model.*), or shard it over more ranks "
                                   "with parallelism.zero_stage = 3 or "
                                   "parallelism.tensor_parallel_degree";
    throw UsageError(StrFormat(
        "the config asks for %s of memory on host %s (%d rank%s; rank %d: activations %s for "
        "training.local_batch_size = %.0f x training.seq_len = %.0f, step batch %s for "
        "training.global_batch_size = %.0f, model state %s for %s parameters of %s with "
        "parallelism.zero_stage = %d and tensor_parallel_degree = %d, checkpoint buffers %s) but "
        "%s has %s available (%s): %s",
        Bytes(asked[host]).c_str(), host.c_str(), ranks[host], ranks[host] > 1 ? "s" : "", r,
        Bytes(p.activations).c_str(), B, T, Bytes(p.batch).c_str(), global_batch,
        Bytes(p.model_state).c_str(), Count(model.PlannedSizes().parameters).c_str(),
        model.SizeKeys().c_str(), shape.zero_stage, tp, Bytes(p.checkpoint).c_str(), host.c_str(),
        Bytes(host_available).c_str(), available.source.c_str(), advice));
  }
  if (B * T > kIntLimit)
    throw UsageError(StrFormat(
        "training.local_batch_size x training.seq_len = %.0f x %.0f = %.0f rows: a micro-batch "
        "has at most 2147483647 (BLAS takes its sizes as int); lower them",
        B, T, B * T));
  return hosts;
}

void CheckDeviceFits(const ModelSpec& model, const TrainingShape& shape,
                     const ComputeBackend& backend, bool whole_logits) {
  double free_bytes = 0, total_bytes = 0;
  std::string where;
  if (!backend.DeviceMemory(&free_bytes, &total_bytes, &where)) return;
  const double B = static_cast<double>(shape.micro_batch), T = static_cast<double>(shape.seq_len);
  const BufferSizes buffers = model.PlannedBuffers(B, T);
  const double activations = buffers.total_bytes + (whole_logits ? buffers.whole_logits_bytes : 0);
  const double parameters = model.PlannedSizes().parameters;
  const double copies = 2 * 4 * parameters;  // fp32 weights and gradients of every unit
  const double asked = activations + copies;
  if (asked <= free_bytes) return;
  throw UsageError(StrFormat(
      "training.device = \"%s\": the model needs %s of device memory (activations %s for "
      "training.local_batch_size = %.0f x training.seq_len = %.0f with mixed_precision_param = "
      "%s, weights and gradients %s for %s parameters of %s) but %s has %s free of %s: %s",
      backend.name().c_str(), Bytes(asked).c_str(), Bytes(activations).c_str(), B, T,
      ComputePrecisionName(backend.compute()), Bytes(copies).c_str(), Count(parameters).c_str(),
      model.SizeKeys().c_str(), where.c_str(), Bytes(free_bytes).c_str(),
      Bytes(total_bytes).c_str(),
      activations >= copies ? "lower training.local_batch_size or training.seq_len"
                            : "choose a smaller model (model.*)"));
}

}  // namespace crucible
