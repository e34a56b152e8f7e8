#include "distributed/param_access.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/hash.h"
#include "common/profile.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {
namespace {
void InjectTestNan(int64_t offset, const ParamUnit& unit, float* grads) {
  if (offset >= 0 && static_cast<size_t>(offset) >= unit.begin &&
      static_cast<size_t>(offset) < unit.end)
    grads[offset - unit.begin] = std::nanf("");
}
}  // namespace

// ---- stages 0 and 1 ----

ReplicatedAccess::ReplicatedAccess(const ParameterTable& table, DataParallel& data_parallel,
                                   ExactAccumulator& accumulator, const float* weights,
                                   float* grads, bool overlap, NonFiniteHandler on_non_finite)
    : table_(table),
      dp_(data_parallel),
      accumulator_(accumulator),
      weights_(weights),
      grads_(grads),
      overlap_(overlap),
      on_non_finite_(std::move(on_non_finite)) {}

const float* ReplicatedAccess::AcquireWeights(int unit) {
  if (overlap_) dp_.Progress();
  return weights_ + table_.units()[unit].begin;
}

float* ReplicatedAccess::Gradients(int unit) {
  return grads_ + table_.units()[unit].begin;
}

void ReplicatedAccess::GradientsReady(int unit) {
  const ParamUnit& u = table_.units()[unit];
  InjectTestNan(test_nan_, u, grads_ + u.begin);
  bool finite = true;
  for (const LayoutFreeRun& run : table_.LayoutFreeRuns(unit))  // the grid's blocks start there
    finite = accumulator_.AddRange(run.begin, run.end, grads_ + run.begin, run.piece) && finite;
  if (!finite && on_non_finite_) on_non_finite_(unit, u.begin, u.end, grads_ + u.begin);
  if (overlap_ && last_) dp_.StartReduction(accumulator_, u.begin, u.end, grads_);
  if (overlap_) dp_.Progress();
}

namespace {
// The runs of `unit` within [begin, end), which must be whole runs (internal error otherwise).
std::vector<LayoutFreeRun> RunsWithin(const ParameterTable& table, int unit, size_t begin,
                                      size_t end) {
  std::vector<LayoutFreeRun> runs;
  size_t covered = begin;
  for (const LayoutFreeRun& run : table.LayoutFreeRuns(unit)) {
    if (run.end <= begin || run.begin >= end) continue;
    if (run.begin != covered || run.end > end) break;
    runs.push_back(run);
    covered = run.end;
  }
  if (covered != end || begin >= end)
    throw Error(kExitFailure, StrFormat("internal: a gradient contribution to elements %zu to %zu "
                                        "of unit %d is not made of whole runs of its grid",
                                        begin, end, unit));
  return runs;
}
}  // namespace

void ReplicatedAccess::AddGradient(int unit, size_t begin, size_t end, float* values) {
  bool finite = true;
  for (const LayoutFreeRun& run : RunsWithin(table_, unit, begin, end))
    finite = accumulator_.AddRange(run.begin, run.end, values + (run.begin - begin), run.piece) &&
             finite;
  if (!finite && on_non_finite_) on_non_finite_(unit, begin, end, values);
}

void ReplicatedAccess::BeginStep() {
  accumulator_.Zero();
}

void ReplicatedAccess::FinishStep(float* grads) {
  if (overlap_)
    dp_.FinishReductions(accumulator_, grads);
  else
    dp_.ReduceGradients(accumulator_, grads);
}

size_t ReplicatedAccess::buffer_bytes() const {
  return overlap_ ? dp_.OverlapBufferBytes() : 0;
}

// ---- stage 3 ----

ShardedAccess::ShardedAccess(const ParameterTable& table, DataParallel& data_parallel,
                             float* weight_shard, bool overlap, NonFiniteHandler on_non_finite)
    : table_(table),
      dp_(data_parallel),
      comm_(data_parallel.comm()),
      weight_shard_(weight_shard),
      overlap_(overlap),
      on_non_finite_(std::move(on_non_finite)),
      shard_begin_(data_parallel.shard_begin()),
      shard_size_(data_parallel.shard_size()) {
  const auto& units = table.units();
  size_t largest_other = 0;
  for (size_t u = 1; u < units.size(); ++u)
    largest_other = std::max(largest_other, units[u].size());
  gathers_.resize(kGatherBuffers);
  for (GatherBuffer& g : gathers_) g.data.resize(table.max_unit_size());
  grad_embedding_.resize(units[0].size());
  grad_unit_.resize(largest_other);
  const size_t piece = std::min(DataParallel::kReducePiece, table.max_unit_size());
  reductions_.resize(kReductionBuffers);
  for (Reduction& r : reductions_) {
    r.send.resize(piece);
    r.receive.resize(std::max<size_t>(1, std::min(piece, shard_size_)));
  }
  shard_sum_.assign(shard_size_, 0);
  // AddGradient's (expert parallelism): the experts of one unit, the largest; a unit's expert
  // tensors are consecutive, and the table's tensors are in unit order.
  if (data_parallel.expert_parallel()) {
    std::vector<size_t> experts(units.size(), 0);
    size_t u = 0;
    for (const ParamInfo& p : table.params()) {
      while (u + 1 < units.size() && p.offset >= units[u].end) ++u;
      if (p.expert >= 0) experts[u] += p.numel;
    }
    const size_t block = *std::max_element(experts.begin(), experts.end());
    extra_.resize(block);
    extra_one_.resize(block);
  }
}

size_t ShardedAccess::buffer_bytes() const {
  size_t bytes = 0;
  for (const GatherBuffer& g : gathers_) bytes += g.data.size() * sizeof(float);
  bytes += (grad_embedding_.size() + grad_unit_.size()) * sizeof(float);
  bytes += (extra_.size() + extra_one_.size()) * 16;
  for (const Reduction& r : reductions_) bytes += (r.send.size() + r.receive.size()) * 16;
  return bytes + shard_sum_.size() * 16;
}

void ShardedAccess::BeginStep() {
  for (GatherBuffer& g : gathers_) {
    if (g.pending) comm_.WaitFor(g.handle);
    g = GatherBuffer{-1, std::move(g.data)};
  }
  std::fill(shard_sum_.begin(), shard_sum_.end(), __int128{0});
}

ShardedAccess::GatherBuffer* ShardedAccess::Find(int unit) {
  for (GatherBuffer& g : gathers_)
    if (g.unit == unit) return &g;
  return nullptr;
}

// The least recently used buffer that is neither in use nor being filled; nullptr if none.
ShardedAccess::GatherBuffer* ShardedAccess::Victim() {
  GatherBuffer* best = nullptr;
  for (GatherBuffer& g : gathers_)
    if (!g.in_use && !g.pending && (!best || g.last_use < best->last_use)) best = &g;
  return best;
}

void ShardedAccess::StartGather(GatherBuffer& buffer, int unit) {
  const ParamUnit& u = table_.units()[unit];
  const ShardLayout& layout = dp_.layout();
  const Range mine = layout.PartIn(static_cast<size_t>(comm_.rank()), u.begin, u.end);
  if (mine.size() > 0)
    std::memcpy(buffer.data.data() + (mine.begin - u.begin),
                weight_shard_ + (mine.begin - shard_begin_), mine.size() * sizeof(float));
  buffer.unit = unit;
  buffer.pending = true;
  buffer.handle = comm_.StartAllGatherV(buffer.data.data(), layout.Parts(u.begin, u.end),
                                        "parameter all-gather");
  ++gathers_started_;
}

void ShardedAccess::Complete(GatherBuffer& buffer) {
  if (!buffer.pending) return;
  {
    ScopedKernelTimer profile_timer("parameter_gather_wait");
    comm_.WaitFor(buffer.handle);
  }
  buffer.pending = false;
  const size_t size = table_.units()[buffer.unit].size();
  if (corrupt_next_) {  // test only
    uint32_t bits;
    std::memcpy(&bits, &buffer.data[size / 2], 4);
    bits ^= 1u << 3;
    std::memcpy(&buffer.data[size / 2], &bits, 4);
    corrupt_next_ = false;
  }
  if (hashing_) {
    uint64_t pair[2] = {gathered_hash_, Hash64(buffer.data.data(), size * sizeof(float))};
    gathered_hash_ = Hash64(pair, sizeof(pair));
  }
}

std::optional<uint64_t> ShardedAccess::TakeGatheredHash() {
  if (!hashing_) return std::nullopt;
  uint64_t h = gathered_hash_;
  gathered_hash_ = 0;
  return h;
}

void ShardedAccess::Progress() {
  for (GatherBuffer& g : gathers_)
    if (g.pending) comm_.Test(g.handle);
  for (Reduction& r : reductions_)
    if (r.pending) dp_.exact().Test(r.handle);
}

const float* ShardedAccess::AcquireWeights(int unit) {
  GatherBuffer* buffer = Find(unit);
  if (!buffer) {
    buffer = Victim();
    if (!buffer) {  // every free buffer is being filled by a prefetch: let the oldest finish
      for (GatherBuffer& g : gathers_)
        if (!g.in_use && (!buffer || g.last_use < buffer->last_use)) buffer = &g;
      if (!buffer) throw Error(kExitFailure, "internal: every ZeRO-3 gather buffer is in use");
      Complete(*buffer);
    }
    StartGather(*buffer, unit);
  }
  Complete(*buffer);
  buffer->in_use = true;
  buffer->last_use = ++clock_;
  return buffer->data.data();
}

void ShardedAccess::ReleaseWeights(int unit) {
  if (GatherBuffer* buffer = Find(unit)) buffer->in_use = false;
  Progress();
}

void ShardedAccess::Prefetch(int unit) {
  if (Find(unit)) return;
  if (GatherBuffer* buffer = Victim()) {
    StartGather(*buffer, unit);
    buffer->last_use = ++clock_;
  }
  Progress();
}

float* ShardedAccess::Gradients(int unit) {
  return unit == 0 ? grad_embedding_.data() : grad_unit_.data();
}

void ShardedAccess::Complete(Reduction& reduction) {
  if (!reduction.pending) return;
  {
    ScopedKernelTimer profile_timer("gradient_reduce_wait");
    dp_.exact().WaitFor(reduction.handle);
  }
  reduction.pending = false;
  AddInt128(reduction.receive.data(), shard_sum_.data() + reduction.receive_offset,
            reduction.receive_count);
}

void ShardedAccess::GradientsReady(int unit) {
  const ParamUnit& u = table_.units()[unit];
  float* grads = Gradients(unit);
  InjectTestNan(test_nan_, u, grads);
  for (const LayoutFreeRun& run : table_.LayoutFreeRuns(unit))  // the grid's blocks start there
    RoundToBlockGrid(grads + (run.begin - u.begin), run.end - run.begin, dp_.exact().grid(),
                     run.piece);
  // In pieces, so the buffers stay small and the first piece is on its way early.
  for (size_t begin = u.begin; begin < u.end; begin += DataParallel::kReducePiece)
    StartReduction(begin, std::min(u.end, begin + DataParallel::kReducePiece),
                   grads + (begin - u.begin));
  if (!non_finite_.empty() && on_non_finite_) on_non_finite_(unit, u.begin, u.end, grads);
  non_finite_.clear();
  extra_unit_ = -1;
  extra_count_ = 0;
}

void ShardedAccess::AddGradient(int unit, size_t begin, size_t end, float* values) {
  const std::vector<LayoutFreeRun> runs = RunsWithin(table_, unit, begin, end);
  if (end - begin > extra_.size())
    throw Error(kExitFailure, "internal: a gradient contribution larger than a unit's experts");
  if (extra_unit_ != unit) {  // the unit's first: [begin, end) is where they all go
    extra_unit_ = unit;
    extra_begin_ = begin;
    extra_count_ = end - begin;
    std::fill(extra_.begin(), extra_.begin() + extra_count_, __int128{0});
  } else if (begin != extra_begin_ || end != extra_begin_ + extra_count_) {
    throw Error(kExitFailure,
                "internal: ZeRO-3 takes one range of other gradient contributions "
                "per unit");
  }
  for (const LayoutFreeRun& run : runs)
    RoundToBlockGrid(values + (run.begin - begin), run.end - run.begin, dp_.exact().grid(),
                     run.piece);
  if (!FloatToInt128(values, extra_one_.data(), end - begin) && on_non_finite_)
    on_non_finite_(unit, begin, end, values);
  AddInt128(extra_one_.data(), extra_.data(), end - begin);
}

void ShardedAccess::StartReduction(size_t begin, size_t end, const float* grads) {
  // A free reduction buffer: the oldest piece's reduce-scatter must have finished.
  Reduction* reduction = nullptr;
  for (Reduction& r : reductions_)
    if (!r.pending) reduction = &r;
  if (!reduction) {
    reduction = &*std::min_element(
        reductions_.begin(), reductions_.end(),
        [](const Reduction& a, const Reduction& b) { return a.started < b.started; });
    Complete(*reduction);
  }
  if (!FloatToInt128(grads, reduction->send.data(), end - begin)) non_finite_ = "yes";
  // Other contributions (AddGradient) to the piece's elements.
  const size_t extra_end = extra_begin_ + extra_count_;
  if (extra_unit_ >= 0 && begin < extra_end && extra_begin_ < end) {
    const size_t b = std::max(begin, extra_begin_), e = std::min(end, extra_end);
    AddInt128(extra_.data() + (b - extra_begin_), reduction->send.data() + (b - begin), e - b);
  }
  // Expert parallelism: the elements every rank of the expert group holds, over that group.
  dp_.SumShared(reduction->send.data(), begin, end);
  const ShardLayout& layout = dp_.layout();
  const Range mine = layout.PartIn(static_cast<size_t>(comm_.rank()), begin, end);
  reduction->receive_offset = mine.size() > 0 ? mine.begin - shard_begin_ : 0;
  reduction->receive_count = mine.size();
  reduction->started = ++clock_;
  reduction->pending = true;
  reduction->handle =
      dp_.exact().StartReduceScatter(reduction->send.data(), reduction->receive.data(),
                                     layout.Parts(begin, end).counts, "gradient reduce-scatter");
  if (!overlap_) Complete(*reduction);
  Progress();
}

void ShardedAccess::FinishStep(float* grad_shard) {
  for (Reduction& r : reductions_) Complete(r);
  const size_t count = dp_.update_end() - dp_.update_begin();
  Int128ToFloat(shard_sum_.data(), grad_shard, count);
}

}  // namespace crucible
