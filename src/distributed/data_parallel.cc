#include "distributed/data_parallel.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/hash.h"
#include "common/profile.h"
#include "common/strings.h"
#include "common/timer.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

DataParallel::DataParallel(Communicator& comm, size_t n_params, int zero_stage, ExactGrid grid)
    : comm_(comm),
      batch_(&comm),
      exact_(comm, grid),
      layout_(n_params, comm.size(), comm.rank(), kNormChunk),
      zero_stage_(zero_stage),
      update_(zero_stage == 0 ? Range{0, n_params} : layout_.Owned()) {
  if (zero_stage != 0 && zero_stage != 1 && zero_stage != 3)
    throw UsageError("parallelism.zero_stage: " + std::to_string(zero_stage) +
                     " is not supported (choose 0, 1 or 3)");
}

void DataParallel::SetExpertParallel(Communicator& batch, Communicator& experts,
                                     std::vector<Range> shared) {
  batch_ = &batch;
  shared_ = std::move(shared);
  if (experts.distributed())
    shared_exact_ = std::make_unique<ExactGroupSum>(experts, exact_.grid());
}

void DataParallel::SumShared(__int128* sums, size_t begin, size_t end) {
  if (!shared_exact_) return;
  ScopedKernelTimer profile_timer("expert_parallel_shared_reduce");
  for (const Range& r : shared_) {
    const size_t b = std::max(begin, r.begin), e = std::min(end, r.end);
    if (b < e)
      shared_exact_->AllReduce(sums + (b - begin), e - b,
                               "shared-gradient all-reduce over the expert-parallel group");
  }
}

void DataParallel::StartReduction(ExactAccumulator& accumulator, size_t unit_begin, size_t unit_end,
                                  float* grads) {
  if (zero_stage_ != 0 && zero_stage_ != 1)
    throw Error(kExitFailure, "internal: StartReduction is for ZeRO stages 0 and 1");
  if (accumulator.in_place())
    throw Error(kExitFailure, "internal: an in-place accumulator has nothing to reduce");
  if (zero_stage_ == 1 && receive_.empty()) {
    receive_.resize(kMaxInFlight);
    for (size_t i = 0; i < kMaxInFlight; ++i) free_buffers_.push_back(static_cast<int>(i));
  }
  SumShared(accumulator.data() + unit_begin, unit_begin, unit_end);
  for (size_t begin = unit_begin; begin < unit_end; begin += kReducePiece) {
    const size_t end = std::min(unit_end, begin + kReducePiece);
    // Bounded: MPI keeps temporary buffers of each reduction in flight.
    if (in_flight_.size() - completed_ >= kMaxInFlight)
      CompletePiece(in_flight_[completed_++], grads);
    if (zero_stage_ == 0) {
      in_flight_.push_back(
          {exact_.StartAllReduce(accumulator.data() + begin, end - begin, "gradient all-reduce"),
           -1, begin, end - begin});
      continue;
    }
    // Rank r receives the part of [begin, end) inside its shard; those parts are consecutive.
    const Range mine = layout_.PartIn(static_cast<size_t>(comm_.rank()), begin, end);
    const int buffer = free_buffers_.back();
    free_buffers_.pop_back();
    std::vector<__int128>& receive = receive_[buffer];
    receive.resize(std::max<size_t>(1, std::min(kReducePiece, shard_size())));
    in_flight_.push_back(
        {exact_.StartReduceScatter(accumulator.data() + begin, receive.data(),
                                   layout_.Parts(begin, end).counts, "gradient reduce-scatter"),
         buffer, mine.begin, mine.size()});
  }
}

void DataParallel::CompletePiece(Piece& piece, float* grads) {
  exact_.WaitFor(piece.handle);
  if (piece.buffer < 0) return;  // stage 0: converted all at once at the end
  Int128ToFloat(receive_[piece.buffer].data(), grads + piece.first, piece.count);
  free_buffers_.push_back(piece.buffer);
}

void DataParallel::Progress() {
  for (size_t i = completed_; i < in_flight_.size(); ++i) exact_.Test(in_flight_[i].handle);
}

double DataParallel::FinishReductions(ExactAccumulator& accumulator, float* grads) {
  ScopedKernelTimer profile_timer("gradient_reduce_wait");
  Timer waited;
  for (size_t i = completed_; i < in_flight_.size(); ++i) CompletePiece(in_flight_[i], grads);
  in_flight_.clear();
  completed_ = 0;
  const double seconds = waited.Seconds();
  if (zero_stage_ == 0 && !accumulator.in_place())
    Int128ToFloat(accumulator.data(), grads, n_params());
  return seconds;
}

void DataParallel::ReduceGradients(ExactAccumulator& accumulator, float* grads) {
  ScopedKernelTimer profile_timer("gradient_reduce");
  if (accumulator.in_place()) {  // one rank, one micro-batch: the gradients are the sums
    if (comm_.size() != 1)
      throw Error(kExitFailure, "internal: an in-place accumulator on more than one rank");
    return;
  }
  if (accumulator.size() != padded_size())
    throw Error(kExitFailure, "internal: accumulator not padded");
  SumShared(accumulator.data(), 0, n_params());
  if (zero_stage_ == 0) {
    exact_.AllReduce(accumulator.data(), padded_size(), "gradient all-reduce");
    Int128ToFloat(accumulator.data(), grads, n_params());
    return;
  }
  // In place: this rank's sums land at the start of the accumulator (one rank: where they are).
  exact_.ReduceScatterInPlace(accumulator.data(), shard_size(), "gradient reduce-scatter");
  const __int128* mine = comm_.size() > 1 ? accumulator.data() : accumulator.data() + update_.begin;
  Int128ToFloat(mine, grads + update_.begin, update_.size());
}

double DataParallel::GradNormSquared(const float* grads_at_base, size_t base) {
  // Partial sums of the chunks this rank owns, then every rank's partials in chunk order.
  const size_t chunks_per_rank = shard_size() / kNormChunk;
  // Rank r owns chunks [r * chunks_per_rank, (r + 1) * chunks_per_rank) of the padded buffer
  // (not update_begin() / kNormChunk: that is clipped to the parameter count, and a rank whose
  // shard lies wholly in the padding would then sum another rank's chunk).
  const size_t first_chunk =
      zero_stage_ == 0 ? 0 : static_cast<size_t>(comm_.rank()) * chunks_per_rank;
  const size_t local_chunks = zero_stage_ == 0 ? padded_size() / kNormChunk : chunks_per_rank;
  std::vector<double> local(local_chunks, 0.0);
  for (size_t c = 0; c < local_chunks; ++c) {
    size_t begin = (first_chunk + c) * kNormChunk;
    size_t end = std::min(n_params(), begin + kNormChunk);
    if (begin < end)
      local[c] = kernels::sum_of_squares(grads_at_base + (begin - base), end - begin);
  }
  std::vector<double> all;
  if (zero_stage_ == 0) {
    all = local;
  } else {
    all.resize(chunks_per_rank * comm_.size());
    comm_.AllGatherDouble(local.data(), all.data(), chunks_per_rank, "gradient-norm all-gather");
  }
  double total = 0.0;
  for (double partial : all) total += partial;
  return total;
}

void DataParallel::GatherParams(float* weights) {
  if (zero_stage_ != 1) return;
  ScopedKernelTimer profile_timer("parameter_gather");
  comm_.AllGatherFloat(weights + shard_begin(), weights, shard_size(), "parameter all-gather");
}

double DataParallel::OrderedSum(const std::vector<double>& local_values) {
  Communicator& batch = *batch_;
  std::vector<double> all(local_values.size() * batch.size());
  batch.AllGatherDouble(local_values.data(), all.data(), local_values.size(), "loss all-gather");
  double total = 0.0;
  for (double v : all) total += v;
  return total;
}

int64_t DataParallel::Sum(int64_t value) {
  batch_->AllReduceInt64(&value, 1, "token-count all-reduce");
  return value;
}

bool DataParallel::Any(bool value) {
  batch_->AllReduceOr(&value, "non-finite flag all-reduce");
  return value;
}

void DataParallel::CheckConsistency(const float* weights, size_t n_params, int64_t step) {
  CheckConsistentHash(Hash64(weights, n_params * sizeof(float)), step, "parameters");
}

void DataParallel::CheckConsistentHash(uint64_t mine, int64_t step, const char* what) {
  std::vector<uint64_t> hashes(comm_.size());
  comm_.AllGatherU64(&mine, hashes.data(), 1, "consistency-check all-gather");
  std::map<uint64_t, int> votes;
  for (uint64_t h : hashes) ++votes[h];
  if (votes.size() == 1) return;
  // The majority's hash; on a tie (two ranks), the lowest rank's.
  uint64_t majority = hashes[0];
  for (uint64_t h : hashes)
    if (votes[h] > votes[majority]) majority = h;
  std::vector<std::string> hosts = comm_.AllGatherString(comm_.host(), "host-name all-gather");
  std::string culprits;
  for (int r = 0; r < comm_.size(); ++r) {
    if (hashes[r] == majority) continue;
    culprits += StrFormat("%srank %d on host %s (hash %s)", culprits.empty() ? "" : ", ", r,
                          hosts[r].c_str(), HexU64(hashes[r]).c_str());
  }
  // Every rank reports; the launcher's bad-node pattern `crucible-sdc` blames the named host.
  for (int r = 0; r < comm_.size(); ++r) {
    if (hashes[r] == majority || r != comm_.rank()) continue;
    comm_.Abort(StrFormat("silent data corruption: rank %d on host %s holds %s that differ "
                          "from the majority (hash %s vs %s) at step %lld",
                          r, hosts[r].c_str(), what, HexU64(hashes[r]).c_str(),
                          HexU64(majority).c_str(), (long long)step),
                kExitFailure);
  }
  comm_.Barrier("consistency-check abort");  // the disagreeing rank aborts the job
  comm_.Abort("consistency check failed at step " + std::to_string(step) + ": " + culprits,
              kExitFailure);
}

namespace {
// Ring algorithms: a reduce-scatter and an all-gather each send (ranks-1)/ranks of the buffer.
// The sums travel as `wire` bytes each (the narrow formats when they fit, the usual case),
// preceded by the all-reduce of two bytes per block of ExactGrid::kBlock that agrees on them.
size_t DescribeBytes(size_t elements, int wire) {
  return wire < 16 ? 2 * 2 * elements / ExactGrid::kBlock : 0;
}
}  // namespace

size_t DataParallel::CommunicatedBytesPerStep(int64_t micro_batches) const {
  const size_t wire = static_cast<size_t>(exact_.wire_bytes());
  // Expert parallelism: the shared elements' exact all-reduce over the expert group first (per
  // step, per micro-batch under ZeRO-3).
  size_t shared = 0;
  if (shared_exact_) {
    const size_t group = static_cast<size_t>(shared_exact_->group().size());
    size_t elements = 0;
    for (const Range& r : shared_) elements += r.size();
    shared = (2 * wire * elements + DescribeBytes(elements, exact_.wire_bytes())) * (group - 1) /
             group * static_cast<size_t>(zero_stage_ == 3 ? micro_batches : 1);
  }
  const size_t world = static_cast<size_t>(comm_.size());
  if (world == 1) return shared;
  const size_t padded = padded_size(), describe = DescribeBytes(padded, exact_.wire_bytes());
  const size_t all_reduce = 2 * wire * padded + describe;
  const size_t reduce_scatter = wire * padded + describe;
  if (zero_stage_ == 0) return shared + all_reduce * (world - 1) / world;
  if (zero_stage_ == 1) return shared + (reduce_scatter + 4 * padded) * (world - 1) / world;
  // Stage 3, per micro-batch: the gradient reduce-scatter, and each unit's parameters gathered
  // for the forward and again for the backward pass (an upper bound: units still cached from
  // the forward pass, the tail and the last layer, are not gathered again).
  return shared + static_cast<size_t>(micro_batches) * (reduce_scatter + 2 * 4 * padded) *
                      (world - 1) / world;
}

size_t DataParallel::Fp32RingBytesPerStep() const {
  const size_t world = static_cast<size_t>(comm_.size());
  return 2 * 4 * n_params() * (world - 1) / world;
}

}  // namespace crucible
