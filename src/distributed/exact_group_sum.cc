#include "distributed/exact_group_sum.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

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

namespace {
// body(begin, end, shift) for each block that elements [first, first + count) touch, with the
// indices relative to `first`, blocks spread over the threads.
template <typename Body>
void ForEachBlock(size_t count, size_t first, const uint8_t* agreed, const Body& body) {
  const size_t kBlock = ExactGrid::kBlock;
  const int64_t blocks = static_cast<int64_t>((first % kBlock + count + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t block = first / kBlock + b;
    body(std::max(first, block * kBlock) - first,
         std::min(first + count, (block + 1) * kBlock) - first, ShiftOf(agreed, block));
  }
}

// f(std::integral_constant<int, width>), so the loops see the width as a constant.
template <typename F>
void WithWidth(int width, const char* what, const F& f) {
  switch (width) {
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    default:
      throw Error(kExitFailure, std::string("internal error: exact_wire::") + what +
                                    ": no wire of " + std::to_string(width) + " bytes");
  }
}
}  // namespace

void Pack(const __int128* sums, size_t count, size_t first, const uint8_t* agreed, int width,
          unsigned char* out) {
  WithWidth(width, "Pack", [&](auto w) {
    constexpr int kWidth = decltype(w)::value;
    ForEachBlock(count, first, agreed, [&](size_t begin, size_t end, int shift) {
      for (size_t i = begin; i < end; ++i) {
        const int64_t value = static_cast<int64_t>(sums[i] >> shift);
        std::memcpy(out + i * kWidth, &value, kWidth);  // little-endian: the low kWidth bytes
      }
    });
  });
}

void Unpack(const unsigned char* in, size_t count, size_t first, const uint8_t* agreed, int width,
            __int128* out) {
  WithWidth(width, "Unpack", [&](auto w) {
    constexpr int kWidth = decltype(w)::value;
    constexpr int kUnused = 64 - 8 * kWidth;
    ForEachBlock(count, first, agreed, [&](size_t begin, size_t end, int shift) {
      for (size_t i = begin; i < end; ++i) {
        uint64_t bits = 0;
        std::memcpy(&bits, in + i * kWidth, kWidth);
        const int64_t value = static_cast<int64_t>(bits << kUnused) >> kUnused;  // sign-extended
        out[i] = static_cast<__int128>(static_cast<U128>(static_cast<__int128>(value)) << shift);
      }
    });
  });
}
}  // namespace exact_wire

std::vector<unsigned char> ExactGroupSum::TakeBuffer(size_t bytes) {
  // The most recently returned spare, grown when it is too small: the spares soon all have the
  // size of the largest piece, so a steady step neither allocates nor zeroes a buffer.
  std::vector<unsigned char> buffer;
  if (!spare_.empty()) {
    buffer = std::move(spare_.back());
    spare_.pop_back();
  }
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer;
}

void ExactGroupSum::StartAgreement(Operation& op, const __int128* sums, size_t count,
                                   const char* what) {
  const size_t blocks = (count + ExactGrid::kBlock - 1) / ExactGrid::kBlock;
  op.agreed.resize(2 * blocks);
  {
    ScopedKernelTimer profile_timer("exact_describe");
    exact_wire::Describe(sums, count, op.agreed.data());
  }
  op.what = what;
  op.agree_handle = group_.StartAllReduceMaxBytes(op.agreed.data(), op.agreed.size(), what);
  op.agreeing = true;
}

void ExactGroupSum::StartData(Operation& op) {
  const char* what = op.what;
  op.agreeing = false;
  {
    // The ranks meet here: the time includes waiting for the slowest to reach this reduction.
    ScopedKernelTimer profile_timer("exact_agree");
    group_.WaitFor(op.agree_handle);
  }
  const size_t blocks = op.agreed.size() / 2;
  const bool fits = exact_wire::Fits(op.agreed.data(), blocks, group_.size(), grid_.wire_bits());
  const bool scatter = !op.counts.empty();
  if (!fits) {
    ++wide_reductions_;
    op.handle = scatter ? group_.StartReduceScatterInt128(op.source, op.out, op.counts, what)
                        : group_.StartAllReduceInt128(op.out, op.total, what);
    op.out = nullptr;  // nothing to unpack
    return;
  }
  ScopedKernelTimer profile_timer("exact_pack");
  const int width = wire_bytes();
  op.send = TakeBuffer(op.total * width);
  exact_wire::Pack(op.source, op.total, 0, op.agreed.data(), width, op.send.data());
  if (!scatter) {
    op.handle = group_.StartAllReduceNarrow(op.send.data(), op.total, width, what);
    return;
  }
  op.receive = TakeBuffer(std::max<size_t>(1, op.count) * width);
  op.handle =
      group_.StartReduceScatterNarrow(op.send.data(), op.receive.data(), op.counts, width, what);
}

void ExactGroupSum::AdvanceUpTo(Handle last) {
  while (!agreeing_.empty() && agreeing_.front() <= last) {
    const Handle handle = agreeing_.front();
    agreeing_.pop_front();
    auto it = operations_.find(handle);
    if (it != operations_.end() && it->second.agreeing) StartData(it->second);
  }
}

ExactGroupSum::Handle ExactGroupSum::StartAllReduce(__int128* sums, size_t count,
                                                    const char* what) {
  const Handle handle = next_handle_++;
  Operation& op = operations_[handle];
  if (!narrow_possible()) {
    op.handle = group_.StartAllReduceInt128(sums, count, what);
    return handle;
  }
  op.source = sums;
  op.out = sums;
  op.total = op.count = count;
  StartAgreement(op, sums, count, what);
  agreeing_.push_back(handle);
  AdvanceUpTo(handle - kAgreeSlack);
  return handle;
}

ExactGroupSum::Handle ExactGroupSum::StartReduceScatter(const __int128* send, __int128* receive,
                                                        const std::vector<size_t>& counts,
                                                        const char* what) {
  const Handle handle = next_handle_++;
  Operation& op = operations_[handle];
  if (!narrow_possible()) {
    op.handle = group_.StartReduceScatterInt128(send, receive, counts, what);
    return handle;
  }
  size_t total = 0, first = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) == group_.rank()) first = total;
    total += counts[r];
  }
  op.source = send;
  op.out = receive;
  op.total = total;
  op.count = counts[group_.rank()];
  op.first = first;
  op.counts = counts;
  StartAgreement(op, send, total, what);
  agreeing_.push_back(handle);
  AdvanceUpTo(handle - kAgreeSlack);
  return handle;
}

bool ExactGroupSum::Test(Handle handle) {
  auto it = operations_.find(handle);
  if (it == operations_.end()) return true;
  if (it->second.agreeing) {  // drive the agreement only: starting the data here would let the
    group_.Test(it->second.agree_handle);  // ranks start collectives in different orders
    return false;
  }
  if (!group_.Test(it->second.handle)) return false;
  WaitFor(handle);  // complete: unpack
  return true;
}

void ExactGroupSum::WaitFor(Handle handle) {
  AdvanceUpTo(handle);
  auto it = operations_.find(handle);
  if (it == operations_.end()) return;
  Operation& op = it->second;
  group_.WaitFor(op.handle);
  if (op.out) {
    const int width = wire_bytes();
    // An all-reduce sums in place in `send`; a reduce-scatter into `receive`.
    const unsigned char* in = op.counts.empty() ? op.send.data() : op.receive.data();
    exact_wire::Unpack(in, op.count, op.first, op.agreed.data(), width, op.out);
  }
  for (std::vector<unsigned char>* buffer : {&op.send, &op.receive})
    if (!buffer->empty()) spare_.push_back(std::move(*buffer));
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
