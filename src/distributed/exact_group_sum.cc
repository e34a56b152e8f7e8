#include "distributed/exact_group_sum.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/profile.h"

namespace crucible {

namespace exact_wire {
namespace {
using U128 = unsigned __int128;

int LowestSetBit(U128 x) {  // x != 0
  const uint64_t low = static_cast<uint64_t>(x);
  return low != 0 ? __builtin_ctzll(low) : 64 + __builtin_ctzll(static_cast<uint64_t>(x >> 64));
}

int BitLength(U128 x) {  // 0 for 0
  const uint64_t high = static_cast<uint64_t>(x >> 64), low = static_cast<uint64_t>(x);
  if (high != 0) return 128 - __builtin_clzll(high);
  return low != 0 ? 64 - __builtin_clzll(low) : 0;
}

int CeilLog2(int n) {
  int bits = 0;
  while ((1 << bits) < n) ++bits;
  return bits;
}

// The shift of block b: 127 - agreed[2b] (any shift for a block of zeros: 0).
inline int ShiftOf(const uint8_t* agreed, size_t block) {
  return agreed[2 * block + 1] == 0 ? 0 : 127 - agreed[2 * block];
}
}  // namespace

void Describe(const __int128* sums, size_t count, uint8_t* out) {
  const int64_t blocks = static_cast<int64_t>((count + ExactGrid::kBlock - 1) / ExactGrid::kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = b * ExactGrid::kBlock, end = std::min(count, begin + ExactGrid::kBlock);
    int lowest = 127, length = 0;
    for (size_t i = begin; i < end; ++i) {
      if (sums[i] == 0) continue;
      const U128 magnitude = sums[i] < 0 ? -static_cast<U128>(sums[i]) : static_cast<U128>(sums[i]);
      lowest = std::min(lowest, LowestSetBit(magnitude));
      length = std::max(length, BitLength(magnitude));
    }
    out[2 * b] = static_cast<uint8_t>(length == 0 ? 0 : 127 - lowest);
    out[2 * b + 1] = static_cast<uint8_t>(length);
  }
}

bool Fits(const uint8_t* agreed, size_t blocks, int ranks, int bits) {
  const int growth = CeilLog2(ranks);
  for (size_t b = 0; b < blocks; ++b) {
    const int length = agreed[2 * b + 1];
    // |sum| < ranks * 2^length <= 2^(length + growth); shifted, below 2^(length - shift + growth).
    if (length != 0 && length - ShiftOf(agreed, b) + growth > bits - 1) return false;
  }
  return true;
}

void Pack(const __int128* sums, size_t count, size_t first, const uint8_t* agreed, int width,
          unsigned char* out) {
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t value =
        static_cast<int64_t>(sums[i] >> ShiftOf(agreed, (first + i) / ExactGrid::kBlock));
    std::memcpy(out + i * width, &value, width);  // little-endian: the low `width` bytes
  }
}

void Unpack(const unsigned char* in, size_t count, size_t first, const uint8_t* agreed, int width,
            __int128* out) {
  const int64_t n = static_cast<int64_t>(count);
  const int unused = 64 - 8 * width;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, in + i * width, width);
    const int64_t value = static_cast<int64_t>(bits << unused) >> unused;  // sign-extended
    out[i] = static_cast<__int128>(static_cast<U128>(static_cast<__int128>(value))
                                   << ShiftOf(agreed, (first + i) / ExactGrid::kBlock));
  }
}
}  // namespace exact_wire

bool ExactGroupSum::Agree(const __int128* sums, size_t count, std::vector<uint8_t>* agreed,
                          const char* what) {
  const size_t blocks = (count + ExactGrid::kBlock - 1) / ExactGrid::kBlock;
  agreed->resize(2 * blocks);
  exact_wire::Describe(sums, count, agreed->data());
  group_.AllReduceMaxBytes(agreed->data(), agreed->size(), what);
  const bool fits = exact_wire::Fits(agreed->data(), blocks, group_.size(), grid_.wire_bits());
  if (!fits) ++wide_reductions_;
  return fits;
}

ExactGroupSum::Handle ExactGroupSum::StartAllReduce(__int128* sums, size_t count,
                                                    const char* what) {
  const Handle handle = next_handle_++;
  Operation& op = operations_[handle];
  if (!narrow_possible() || !Agree(sums, count, &op.agreed, what)) {
    op.handle = group_.StartAllReduceInt128(sums, count, what);
    return handle;
  }
  ScopedKernelTimer profile_timer("exact_pack");
  const int width = wire_bytes();
  op.send.resize(count * width);
  exact_wire::Pack(sums, count, 0, op.agreed.data(), width, op.send.data());
  op.out = sums;
  op.count = count;
  op.handle = group_.StartAllReduceNarrow(op.send.data(), count, width, what);
  return handle;
}

ExactGroupSum::Handle ExactGroupSum::StartReduceScatter(const __int128* send, __int128* receive,
                                                        const std::vector<size_t>& counts,
                                                        const char* what) {
  const Handle handle = next_handle_++;
  Operation& op = operations_[handle];
  size_t total = 0, first = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) == group_.rank()) first = total;
    total += counts[r];
  }
  if (!narrow_possible() || !Agree(send, total, &op.agreed, what)) {
    op.handle = group_.StartReduceScatterInt128(send, receive, counts, what);
    return handle;
  }
  ScopedKernelTimer profile_timer("exact_pack");
  const int width = wire_bytes();
  op.send.resize(total * width);
  op.receive.resize(std::max<size_t>(1, counts[group_.rank()]) * width);
  exact_wire::Pack(send, total, 0, op.agreed.data(), width, op.send.data());
  op.out = receive;
  op.count = counts[group_.rank()];
  op.first = first;
  op.handle =
      group_.StartReduceScatterNarrow(op.send.data(), op.receive.data(), counts, width, what);
  return handle;
}

bool ExactGroupSum::Test(Handle handle) {
  auto it = operations_.find(handle);
  if (it == operations_.end()) return true;
  if (!group_.Test(it->second.handle)) return false;
  WaitFor(handle);  // complete: unpack
  return true;
}

void ExactGroupSum::WaitFor(Handle handle) {
  auto it = operations_.find(handle);
  if (it == operations_.end()) return;
  Operation& op = it->second;
  group_.WaitFor(op.handle);
  if (op.out) {
    const int width = wire_bytes();
    // An all-reduce sums in place in `send`; a reduce-scatter into `receive`.
    const unsigned char* in = op.receive.empty() ? op.send.data() : op.receive.data();
    exact_wire::Unpack(in, op.count, op.first, op.agreed.data(), width, op.out);
  }
  operations_.erase(it);
}

void ExactGroupSum::AllReduce(__int128* sums, size_t count, const char* what) {
  // In pieces, so the narrow buffers stay bounded (and within MPI's int counts).
  constexpr size_t kPiece = size_t{1} << 24;
  for (size_t done = 0; done < count; done += kPiece)
    WaitFor(StartAllReduce(sums + done, std::min(kPiece, count - done), what));
}

void ExactGroupSum::ReduceScatterInPlace(__int128* data, size_t count, const char* what) {
  if (!narrow_possible()) {
    group_.ReduceScatterInt128InPlace(data, count, what);
    return;
  }
  std::vector<__int128> mine(std::max<size_t>(1, count));
  WaitFor(StartReduceScatter(data, mine.data(),
                             std::vector<size_t>(static_cast<size_t>(group_.size()), count), what));
  std::copy(mine.begin(), mine.begin() + count, data);
}

bool ExactGroupSum::AllReduceFloat(const float* in, float* out, size_t count, const char* what) {
  std::vector<float> rounded(in, in + count);
  RoundToBlockGrid(rounded.data(), count, grid_);
  std::vector<__int128> sums(count);
  bool refused = !FloatToInt128(rounded.data(), sums.data(), count);
  group_.AllReduceOr(&refused, what);
  AllReduce(sums.data(), count, what);
  Int128ToFloat(sums.data(), out, count);
  return !refused;
}

}  // namespace crucible
