// The one way to sum values exactly over a group of ranks: the data-parallel gradient sums today,
// and every later reduction (tensor-parallel partial sums, expert combines, GRPO's means).
//
// The values are 128-bit fixed-point integers (binary point at 2^-64, distributed/exact_sum.h),
// put on the grid of the group's ExactGrid by their owner before the sum; integer addition is
// associative, so the group's sum is the same integers in any order and for any number of ranks.
// The wire never rounds: it is a lossless encoding of those integers.
//
// - fixed128: every sum travels as 16 bytes (an MPI reduction with a user-defined op).
// - block48 / block32: per block of ExactGrid::kBlock consecutive sums, every rank describes its
//   values in two bytes (its lowest set bit and the bit length of its largest magnitude), and one
//   MPI_MAX over those bytes gives every rank the same shift (the lowest set bit of the group)
//   and bound. When, for every block of the reduction, bound - shift + ceil(log2 ranks) fits a
//   signed integer of wire_bits() (48 or 32), the sums travel shifted, as 6- or 4-byte integers
//   (the MPI sum of those cannot overflow); otherwise that reduction travels as 16 bytes. Either
//   way the result is the same integers. The block rounding (RoundToBlockGrid) is what keeps
//   the span small: a block rounded to 1 + m significant bits spans m + 1 bits, plus the spread
//   of the block's exponent over the contributions and log2 of their count.
//
// The order of a reduction is therefore irrelevant by construction; its grid is stated by the
// ExactGrid, and ranks must start the same reductions in the same order. The byte all-reduce
// of a narrow reduction is started with it and does not block: its sums are packed and sent
// once kAgreeSlack later reductions have been started, or when it is waited for (Test only
// drives MPI's progress: it never starts a collective, so every rank starts its collectives in
// one order, that of the calls to Start* and WaitFor, whatever completes first). A rank thus
// runs up to kAgreeSlack reductions ahead of the slowest before it waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/exact_sum.h"

namespace crucible {

// The block arithmetic of the narrow wire, without MPI.
namespace exact_wire {
// Two bytes per block of ExactGrid::kBlock sums (the last may be short): [127 - the lowest set
// bit of any nonzero sum, the bit length of the largest magnitude]; [0, 0] for a block of zeros.
// The element-wise maximum of every rank's bytes describes the group's block.
void Describe(const __int128* sums, size_t count, uint8_t* out);
// Whether every block's sum over `ranks` ranks fits a signed `bits`-bit integer after its shift.
bool Fits(const uint8_t* agreed, size_t blocks, int ranks, int bits);
// out[i] (width bytes, little-endian) = sums[i] >> (the shift of the block of element first + i);
// exact, since the agreed shift is at most every rank's lowest set bit.
void Pack(const __int128* sums, size_t count, size_t first, const uint8_t* agreed, int width,
          unsigned char* out);
// The inverse: out[i] = in[i] (sign-extended) << the shift of element first + i's block.
void Unpack(const unsigned char* in, size_t count, size_t first, const uint8_t* agreed, int width,
            __int128* out);
}  // namespace exact_wire

class ExactGroupSum {
 public:
  using Handle = int64_t;
  ExactGroupSum(Communicator& group, ExactGrid grid) : group_(group), grid_(grid) {}
  Communicator& group() { return group_; }
  const ExactGrid& grid() const { return grid_; }
  // Bytes one sum takes on the wire when it fits: 16, 6 or 4.
  int wire_bytes() const { return grid_.wire_bits() / 8; }
  // Reductions so far that did not fit their narrow width and travelled as 16 bytes.
  int64_t wide_reductions() const { return wide_reductions_; }

  // In place: sums[0, count) of this rank; on completion the group's exact sums.
  Handle StartAllReduce(__int128* sums, size_t count, const char* what);
  // `send` holds consecutive blocks of counts[0], counts[1], ... sums; rank r receives the
  // exact sums of block r in `receive` (counts[rank] elements), which must not overlap `send`.
  Handle StartReduceScatter(const __int128* send, __int128* receive,
                            const std::vector<size_t>& counts, const char* what);
  bool Test(Handle handle);
  void WaitFor(Handle handle);
  // Blocking forms. ReduceScatterInPlace: size() blocks of `count` sums; on return
  // data[0, count) holds the exact sums of this rank's block.
  void AllReduce(__int128* sums, size_t count, const char* what);
  void ReduceScatterInPlace(__int128* data, size_t count, const char* what);
  // out[i] = the float nearest the group's exact sum of in[i], each rank's values first rounded
  // onto the grid (RoundToBlockGrid, blocks from in[0]). False (on every rank) if any rank held a
  // non-finite or too large value; those count as 0.
  bool AllReduceFloat(const float* in, float* out, size_t count, const char* what);

 private:
  static constexpr Handle kAgreeSlack = 2;
  struct Operation {
    Communicator::Handle handle = -1;
    // Until the agreement is waited for: what the data collective will need.
    bool agreeing = false;
    Communicator::Handle agree_handle = -1;
    const __int128* source = nullptr;  // an all-reduce sums in place (source == out)
    size_t total = 0;                  // sums in `source`
    std::vector<size_t> counts;        // a reduce-scatter's blocks; empty for an all-reduce
    const char* what = "";             // for the messages of its collectives
    std::vector<uint8_t> agreed;
    std::vector<unsigned char> send, receive;  // from TakeBuffer, at least the bytes they carry
    __int128* out = nullptr;
    size_t count = 0, first = 0;
  };
  // Describes sums[0, count) into op.agreed and starts the byte all-reduce of the group.
  void StartAgreement(Operation& op, const __int128* sums, size_t count, const char* what);
  // Waits for op's agreement and starts its data collective: narrow when every block fits, else
  // 16 bytes a sum.
  void StartData(Operation& op);
  // StartData for every agreeing operation up to `last`, in the order they were started.
  void AdvanceUpTo(Handle last);
  // A byte buffer of at least `bytes` (its size may be larger), a spare of a finished operation
  // when there is one.
  std::vector<unsigned char> TakeBuffer(size_t bytes);
  bool narrow_possible() const { return grid_.wire_bits() < 128 && group_.distributed(); }
  Communicator& group_;
  ExactGrid grid_;
  std::unordered_map<Handle, Operation> operations_;
  Handle next_handle_ = 0;
  int64_t wide_reductions_ = 0;
  std::vector<std::vector<unsigned char>> spare_;
  std::deque<Handle> agreeing_;  // started, agreement not yet waited for, oldest first
};

}  // namespace crucible
