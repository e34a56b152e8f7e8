// Data parallelism over flat buffers, with results that do not depend on the number of ranks.
//
// Each rank sums the gradients of its micro-batches exactly (ExactAccumulator); the ranks then
// add their 128-bit fixed-point sums with integer MPI reductions, which are exact and therefore
// order-free, and convert to fp32 once. The gradient norm is a sum of squares over fixed chunks of
// kNormChunk elements, combined in chunk order on every rank, so it matches the single-process
// norm bit for bit. Micro-batch losses are gathered and summed in global micro-batch order.
//
// ZeRO stage 1 shards the optimizer state: the gradient is reduce-scattered, each rank updates
// its shard of the parameters, and the shards are all-gathered. Stage 3 shards the parameters
// too: a rank stores only its shard, and the model gathers each unit (a decoder layer, the
// embedding, the tail) when it needs it (distributed/param_access.h). Shards are whole multiples of
// kNormChunk, so buffers are padded to padded_size(). Stage 0 keeps everything replicated.
//
// Overlap: gradients can be reduced unit by unit, each reduction started (non-blocking) as soon
// as the backward pass has finished the unit in the step's last micro-batch, while it goes on
// with the units below; FinishReductions() waits for what is still in flight.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/exact_group_sum.h"
#include "distributed/exact_sum.h"
#include "distributed/shard_layout.h"

namespace crucible {

class DataParallel {
 public:
  static constexpr size_t kNormChunk = size_t{1} << 14;
  // Overlapped gradient reductions go in pieces of at most this many elements.
  static constexpr size_t kReducePiece = size_t{1} << 19;
  static constexpr size_t kMaxInFlight = 8;

  // Over the data-parallel group `comm` (ProcessMesh::data_parallel(): the ranks that hold the
  // same parameters), which must outlive it; the gradient sums travel in the format of `grid`
  // ([parallelism] exact_reduction).
  DataParallel(Communicator& comm, size_t n_params, int zero_stage, ExactGrid grid = {});

  // Expert parallelism: the ranks of `batch` read different micro-batches (the data-parallel
  // and the expert-parallel ranks), so the losses and flags are summed over it; `experts` is this
  // rank's expert-parallel group, whose ranks hold different experts and the same `shared`
  // elements (flat [begin, end) ranges, ascending: every tensor but the experts'). The gradient
  // sums of the shared elements are summed over `experts` first (SumShared), then over the
  // data-parallel group like every sum. Both groups must outlive this.
  void SetExpertParallel(Communicator& batch, Communicator& experts, std::vector<Range> shared);
  // The ranks whose micro-batches make a step: `batch` above, else the data-parallel group.
  Communicator& batch() { return *batch_; }
  // True when some gradient sums take other ranks' contributions beyond the data-parallel
  // group's (expert parallelism over more than one rank).
  bool expert_parallel() const { return shared_exact_ != nullptr; }
  // sums[i - begin], i in [begin, end): the shared elements' exact sums over the expert-parallel
  // group, in place (blocking; nothing without expert parallelism). Every rank of the group
  // calls it for the same ranges in the same order.
  void SumShared(__int128* sums, size_t begin, size_t end);

  int zero_stage() const { return zero_stage_; }
  // How the flat buffers are sharded over the group (also for stage 0, which does not shard).
  const ShardLayout& layout() const { return layout_; }
  // Length every flat buffer (weights, gradients, accumulator) must have.
  size_t padded_size() const { return layout_.padded_size(); }
  // The part of the parameters this rank updates ([0, n_params) for stage 0).
  size_t update_begin() const { return update_.begin; }
  size_t update_end() const { return update_.end; }
  // Rank r's shard is [r * shard_size(), (r + 1) * shard_size()) of the padded buffer.
  size_t shard_size() const { return layout_.shard_size(); }
  size_t shard_begin() const { return layout_.shard_begin(); }
  size_t n_params() const { return layout_.n_params(); }
  Communicator& comm() { return comm_; }
  // The exact sum over the group that every gradient reduction goes through.
  ExactGroupSum& exact() { return exact_; }

  // Exact sum of every rank's accumulator; fp32 result in grads[update_begin, update_end). An
  // in-place accumulator (one rank, one micro-batch) has already left the sums in grads.
  void ReduceGradients(ExactAccumulator& accumulator, float* grads);
  // Stages 0 and 1, overlapped: starts the exact reduction of accumulator[begin, end) (a
  // unit's final sum on this rank); FinishReductions() waits for every reduction started and
  // converts the result to grads[update_begin, update_end). Returns the seconds it waited.
  void StartReduction(ExactAccumulator& accumulator, size_t begin, size_t end, float* grads);
  void Progress();
  double FinishReductions(ExactAccumulator& accumulator, float* grads);
  // Bytes of the receive buffers of overlapped ZeRO-1 reductions (allocated on first use).
  size_t OverlapBufferBytes() const {
    return zero_stage_ == 1
               ? kMaxInFlight * std::max<size_t>(1, std::min(kReducePiece, shard_size())) * 16
               : 0;
  }
  // Squared global norm of the gradient, identical for any number of ranks. grads[i - base]
  // holds element i for i in [update_begin, update_end) (base 0: a full-size buffer; base
  // shard_begin(): a shard).
  double GradNormSquared(const float* grads, size_t base = 0);
  // Stage 1: every rank receives every shard of the updated parameters (nothing for 0 and 3).
  void GatherParams(float* weights);
  // Sum of every rank's values in rank order (so in global micro-batch order when each rank
  // holds its consecutive micro-batches), identical for any number of ranks. These three are
  // over batch().
  double OrderedSum(const std::vector<double>& local_values);
  int64_t Sum(int64_t value);
  bool Any(bool value);
  // Compares a hash of the replicated parameters across ranks; on a mismatch aborts the job
  // with "silent data corruption: rank R on host H ..." naming each rank that disagrees with the
  // majority.
  void CheckConsistency(const float* weights, size_t n_params, int64_t step);
  // The same for a hash this rank computed of something every rank must hold identically
  // (`what`, for the message).
  void CheckConsistentHash(uint64_t mine, int64_t step, const char* what);
  // Bytes this rank sends per step for the gradient reduction and parameter gathers (model of
  // ring algorithms; ZeRO-3 reduce-scatters once per micro-batch), expert parallelism's shared
  // sums included.
  size_t CommunicatedBytesPerStep(int64_t micro_batches = 1) const;
  // The minimum of an fp32 ring all-reduce of the gradient, 2 (R-1)/R 4 P bytes: what the
  // exact formats are measured against.
  size_t Fp32RingBytesPerStep() const;

 private:
  Communicator& comm_;
  Communicator* batch_;
  ExactGroupSum exact_;
  std::unique_ptr<ExactGroupSum> shared_exact_;  // over the expert-parallel group
  std::vector<Range> shared_;
  ShardLayout layout_;
  int zero_stage_;
  Range update_;
  // Overlapped reductions, one Piece per piece in flight. Stage 0 all-reduces the piece in place
  // in the accumulator (converted to fp32 all at once by FinishReductions); stage 1
  // reduce-scatters it into one of kMaxInFlight receive buffers of this rank's sums (receive_),
  // converted to fp32 into the gradient when the piece completes.
  struct Piece {
    ExactGroupSum::Handle handle;
    int buffer;           // into receive_, or -1 (stage 0: reduced in place)
    size_t first, count;  // the parameters its sums belong to
  };
  void CompletePiece(Piece& piece, float* grads);
  std::vector<Piece> in_flight_;
  size_t completed_ = 0;  // in_flight_[0, completed_) are complete and converted
  std::vector<std::vector<__int128>> receive_;
  std::vector<int> free_buffers_;
};

}  // namespace crucible
