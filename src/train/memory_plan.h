// The memory a training config asks for, computed before anything is allocated, and the check
// that it fits the machine: an absurd size (training.seq_len = 1e9, a vocabulary of 2e9) is a
// config error (exit 2) that says how much was asked and how much there is, instead of an "out of
// memory" half way through allocating. Everything is computed in double, so no product of config
// values can overflow on the way; the products the code later keeps in integers are checked
// against their integer limits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "compute/backend.h"
#include "distributed/communicator.h"
#include "model/model.h"
#include "train/training_config.h"

namespace crucible {

// Bytes one rank allocates, by what they are for (the formula of docs/distributed.md).
struct MemoryPlan {
  double activations = 0;  // the model's activations of one micro-batch (and its token buffers)
  double batch = 0;        // the loader's batches: this one and the next, read ahead
  double model_state = 0;  // weights, gradients, exact sums, optimizer state, comm buffers
  double checkpoint = 0;   // rank 0: the host snapshot and the full state gathered for a save
  double total() const { return activations + batch + model_state + checkpoint; }
};

// The plan of rank `rank` of `world` for the resolved `config`. `activations_on_host` false (a
// model built on a device backend): the host holds only the model's copies of the targets and
// losses; the activations are CheckDeviceFits' to check.
// Under tensor parallelism `rank` and `world` are the data-parallel rank and degree, and
// `parallelism` the rank's place in its tensor-parallel group: its parts of the table and its
// activations (ModelSpec::PlannedSizes, PlannedBuffers).
MemoryPlan PlanMemory(const Config& config, const ModelSpec& model, const TrainingShape& shape,
                      int rank, int world, bool activations_on_host = true,
                      const ModelParallelism& parallelism = {});

// What this machine can still give: MemAvailable of /proc/meminfo, or less where a cgroup limit
// is lower. `bytes` is infinite where neither can be read.
struct AvailableMemory {
  double bytes = 0;
  std::string source;
};
AvailableMemory MachineAvailableMemory();

// Collective. Throws UsageError on every rank when the ranks of some host together plan more
// than that host has available, or when a product the trainer keeps in an integer exceeds its
// type (tokens and sample indices in int64; a micro-batch's rows, which BLAS takes as int). Rank 0
// prints the plan (phase=memory_check). A batch-size ramp is planned at its largest stage. The
// activations count on the host only when `backend`'s memory is the host's.
// `parallelism`: the job's tensor-parallel layout (its degree, chunks and sequence parallelism;
// the rank comes from the rank in `comm`, the world, whose groups are consecutive ranks).
// Returns the host of every rank of `comm`, which it gathered to add up each host's ranks.
std::vector<std::string> CheckTrainingFits(const Config& config, const ModelSpec& model,
                                           const TrainingConfig& training, Communicator& comm,
                                           const ComputeBackend& backend,
                                           const ModelParallelism& parallelism = {});

// The device side, for a backend whose memory is not the host's: a model built on it keeps its
// activations (ModelSpec::PlannedBuffers) and a device copy of every unit's weights and gradients
// there (and the whole logits with `whole_logits`: an optimizer that samples targets from them).
// UsageError naming the device, what is asked and what is free, and what to lower, when that is
// more than the device has free; nothing on the host's backend.
void CheckDeviceFits(const ModelSpec& model, const TrainingShape& shape,
                     const ComputeBackend& backend, bool whole_logits);

}  // namespace crucible
