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
// The sums as 64-bit words, little-endian: element i is words [2i] (low) and [2i + 1] (high).
// Loops over the words (not over __int128, whose shifts and compares GCC does not vectorise)
// vectorise, at a few bytes a cycle.
typedef uint64_t __attribute__((__may_alias__)) Word;

int CeilLog2(int n) {
  int bits = 0;
  while ((1 << bits) < n) ++bits;
  return bits;
}

// The shift of block b: 127 - agreed[2b] (any shift for a block of zeros: 0).
inline int ShiftOf(const uint8_t* agreed, size_t block) {
  return agreed[2 * block + 1] == 0 ? 0 : 127 - agreed[2 * block];
}

// Describe's two bytes of one block of n sums. The lowest set bit of any nonzero sum is that of
// the OR of the sums (x and -x have the same lowest set bit), the largest bit length that of
// the OR of the magnitudes; the magnitude of a negative x is ~x + 1, the carry into the high
// word when the low word of ~x + 1 wraps to 0.
void DescribeBlock(const __int128* sums, size_t n, uint8_t* out) {
  const Word* words = reinterpret_cast<const Word*>(sums);
  uint64_t any_low = 0, any_high = 0, magnitude_low = 0, magnitude_high = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t low = words[2 * i], high = words[2 * i + 1];
    any_low |= low;
    any_high |= high;
    const uint64_t sign = static_cast<uint64_t>(static_cast<int64_t>(high) >> 63);  // 0 or ~0
    const uint64_t magnitude = (low ^ sign) - sign;
    magnitude_low |= magnitude;
    magnitude_high |= (high ^ sign) + (sign & static_cast<uint64_t>(magnitude == 0));
  }
  const int length = magnitude_high != 0  ? 128 - __builtin_clzll(magnitude_high)
                     : magnitude_low != 0 ? 64 - __builtin_clzll(magnitude_low)
                                          : 0;
  const int lowest = any_low != 0    ? __builtin_ctzll(any_low)
                     : any_high != 0 ? 64 + __builtin_ctzll(any_high)
                                     : 127;
  out[0] = static_cast<uint8_t>(length == 0 ? 0 : 127 - lowest);
  out[1] = static_cast<uint8_t>(length);
}
}  // namespace

void Describe(const __int128* sums, size_t count, uint8_t* out) {
  const int64_t blocks = static_cast<int64_t>((count + ExactGrid::kBlock - 1) / ExactGrid::kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = b * ExactGrid::kBlock, end = std::min(count, begin + ExactGrid::kBlock);
    DescribeBlock(sums + begin, end - begin, out + 2 * b);
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

// out[i] (kWidth bytes) = the low bytes of sums[i] >> shift, for the n sums of one block: the low
// word of the shifted sum, low >> shift | high << (64 - shift) below 64 (written as two shifts,
// so that a shift of 0 is defined), high >> (shift - 64) (arithmetic) from 64. In chunks through
// a small buffer, so that the shifts vectorise; the stores of 6 bytes are 8-byte stores whose
// last two bytes the next element's store overwrites, except the block's last (the block's
// bytes are all its own: blocks on other threads never see a stray byte).
template <int kWidth>
void PackBlock(const __int128* sums, size_t n, int shift, unsigned char* out) {
  constexpr size_t kChunk = 64;
  uint64_t values[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t m = std::min(kChunk, n - c);
    const Word* words = reinterpret_cast<const Word*>(sums + c);
    if (shift < 64) {
      const int left = 63 - shift;
      for (size_t i = 0; i < m; ++i)
        values[i] = (words[2 * i] >> shift) | ((words[2 * i + 1] << 1) << left);
    } else {
      const int right = shift - 64;
      for (size_t i = 0; i < m; ++i)
        values[i] = static_cast<uint64_t>(static_cast<int64_t>(words[2 * i + 1]) >> right);
    }
    unsigned char* o = out + c * kWidth;
    if constexpr (kWidth == 8) {
      std::memcpy(o, values, m * sizeof(uint64_t));
    } else if constexpr (kWidth == 4) {
      for (size_t i = 0; i < m; ++i) {
        const uint32_t value = static_cast<uint32_t>(values[i]);
        std::memcpy(o + i * kWidth, &value, kWidth);
      }
    } else {
      const size_t whole = c + m == n ? m - 1 : m;  // the block's last gets kWidth bytes
      for (size_t i = 0; i < whole; ++i) std::memcpy(o + i * kWidth, values + i, 8);
      if (whole < m) std::memcpy(o + whole * kWidth, values + whole, kWidth);
    }
  }
}

// The kWidth-byte integer at `at`, sign-extended; `whole`: 8 bytes may be read there.
template <int kWidth>
inline int64_t LoadWire(const unsigned char* at, bool whole) {
  constexpr int kUnused = 64 - 8 * kWidth;
  uint64_t bits = 0;
  if (whole)
    std::memcpy(&bits, at, sizeof bits);
  else
    std::memcpy(&bits, at, kWidth);
  return static_cast<int64_t>(bits << kUnused) >> kUnused;
}

// out[i] = in[i] (sign-extended) << shift for the n sums of one block: below 64 the words are
// value << shift and value >> (64 - shift) (arithmetic, two shifts so that 0 is defined), from
// 64 they are 0 and value << (shift - 64). Every element but the last reads 8 bytes.
template <int kWidth>
void UnpackBlock(const unsigned char* in, size_t n, int shift, __int128* out) {
  if (n == 0) return;
  Word* words = reinterpret_cast<Word*>(out);
  const size_t whole = kWidth == 8 ? n : n - 1;
  if (shift < 64) {
    const int right = 63 - shift;
    const auto store = [&](size_t i, int64_t value) {
      words[2 * i] = static_cast<uint64_t>(value) << shift;
      words[2 * i + 1] = static_cast<uint64_t>((value >> 1) >> right);
    };
    for (size_t i = 0; i < whole; ++i) store(i, LoadWire<kWidth>(in + i * kWidth, true));
    if (whole < n) store(whole, LoadWire<kWidth>(in + whole * kWidth, false));
    return;
  }
  const int left = shift - 64;
  for (size_t i = 0; i < n; ++i) {
    words[2 * i] = 0;
    words[2 * i + 1] = static_cast<uint64_t>(LoadWire<kWidth>(in + i * kWidth, i < whole)) << left;
  }
}
}  // namespace

void Pack(const __int128* sums, size_t count, size_t first, const uint8_t* agreed, int width,
          unsigned char* out) {
  WithWidth(width, "Pack", [&](auto w) {
    constexpr int kWidth = decltype(w)::value;
    ForEachBlock(count, first, agreed, [&](size_t begin, size_t end, int shift) {
      PackBlock<kWidth>(sums + begin, end - begin, shift, out + begin * kWidth);
    });
  });
}

void Unpack(const unsigned char* in, size_t count, size_t first, const uint8_t* agreed, int width,
            __int128* out) {
  WithWidth(width, "Unpack", [&](auto w) {
    constexpr int kWidth = decltype(w)::value;
    ForEachBlock(count, first, agreed, [&](size_t begin, size_t end, int shift) {
      UnpackBlock<kWidth>(in + begin * kWidth, end - begin, shift, out + begin);
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
  const int width = wire_bytes();
  {
    ScopedKernelTimer profile_timer("exact_pack");
    op.send = TakeBuffer(op.total * width);
    exact_wire::Pack(op.source, op.total, 0, op.agreed.data(), width, op.send.data());
    if (scatter) op.receive = TakeBuffer(std::max<size_t>(1, op.count) * width);
  }
  // Starting a nonblocking collective may already move data: MPI's own time, apart.
  ScopedKernelTimer profile_timer("exact_data_start");
  op.handle = scatter ? group_.StartReduceScatterNarrow(op.send.data(), op.receive.data(),
                                                        op.counts, width, what)
                      : group_.StartAllReduceNarrow(op.send.data(), op.total, width, what);
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
    ScopedKernelTimer profile_timer("exact_unpack");
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
