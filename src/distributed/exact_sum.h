// Exact gradient accumulation. Each micro-batch's float gradient is converted to 128-bit fixed
// point (binary point at 2^-64) and added as integers. Integer addition is associative, so the
// sum does not depend on the order of micro-batches, threads or ranks: DP=1 with gradient
// accumulation and DP=4 without produce the same bits. Values with |g| >= 2^-40 convert
// exactly; smaller ones are truncated at 2^-64 (5.4e-20 absolute); |g| must stay below 2^62.
// The total converts back to float once per step (int128 -> double -> float, both rounded to
// nearest).
//
// One rank with one micro-batch gives each element one contribution a step, and the exact sum of
// one value is that value truncated at 2^-64: an in-place accumulator (ExactAccumulator::InPlace)
// keeps no 128-bit sums (16 bytes a parameter) and rounds the gradients where they are, in one
// pass, to the bits the 128-bit round trip gives, so a run on one rank still ends bit-identical
// to one on any number of ranks.
//
// The grid ([parallelism] exact_reduction, ExactGrid). "fixed128" adds each value as it is
// (truncated at 2^-64). "block48" and "block32" first round each contribution (one micro-batch's
// gradient of a unit, one rank's partial sum) onto a grid per block of kBlock consecutive values:
// with e the exponent of the block's largest magnitude (2^e <= max|v| < 2^(e+1)), every value of
// the block is rounded to the nearest multiple of 2^(e - mantissa_bits) (ties to even),
// RoundToBlockGrid. The rounding is a function of the contribution alone, so the sum of the
// rounded values is still independent of order, rank count and micro-batch split; what it buys is
// that the 128-bit sums of a block then span few bits and travel losslessly as 48- or 32-bit
// integers (distributed/exact_group_sum.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace crucible {

enum class ExactFormat { kFixed128, kBlock48, kBlock32 };

// How values are put on the grid of an exact sum, and how wide its sums travel.
struct ExactGrid {
  static constexpr size_t kBlock = 256;  // values sharing one exponent, aligned to a unit's start
  ExactFormat format = ExactFormat::kFixed128;

  // Bits kept below each block's leading bit (a block's largest value keeps 1 + mantissa_bits
  // significant bits); -1: no block rounding (fixed128).
  int mantissa_bits() const {
    return format == ExactFormat::kBlock48 ? 23 : format == ExactFormat::kBlock32 ? 16 : -1;
  }
  // Width of one sum on the wire, in bits: 128, 48 or 32.
  int wire_bits() const {
    return format == ExactFormat::kBlock48 ? 48 : format == ExactFormat::kBlock32 ? 32 : 128;
  }
  const char* name() const {
    return format == ExactFormat::kBlock48   ? "block48"
           : format == ExactFormat::kBlock32 ? "block32"
                                             : "fixed128";
  }
  // "fixed128", "block48" or "block32"; anything else is a UsageError naming `key`.
  static ExactGrid Parse(const std::string& name, const char* key);
};

// Rounds values[0, n) onto the grid, in blocks of kBlock from values[0] that start again at
// every `piece` values (0: n, one piece): each value to the nearest multiple of
// 2^(e - mantissa_bits), e the exponent of its block's largest magnitude (ties to even; the
// results are floats again). A block holding a non-finite value is left as it is (the
// fixed-point conversion then refuses it). Nothing to do for fixed128.
//
// Which values share a block decides each value's rounding, so the blocks must hold the same
// elements of the model in every layout a run can take: a unit of the flat buffer, which every
// data-parallel degree holds whole; under tensor parallelism, a run of one tensor within one of
// its chunks (model/parameters.h, ParameterTable::LayoutFreeRuns), which every degree holds whole
// while a rank's part of a tensor cut along its columns is laid out differently at each degree.
void RoundToBlockGrid(float* values, size_t n, const ExactGrid& grid, size_t piece = 0);

class ExactAccumulator {
 public:
  explicit ExactAccumulator(size_t size, ExactGrid grid = {}) : sum_(size), grid_(grid) {}
  // For one contribution per element per step (one rank, one micro-batch): no sums are kept;
  // AddRange rounds the values in place, and they are then the step's gradients.
  static ExactAccumulator InPlace(ExactGrid grid = {}) {
    ExactAccumulator a(0, grid);
    a.in_place_ = true;
    return a;
  }
  const ExactGrid& grid() const { return grid_; }
  bool in_place() const { return in_place_; }
  size_t size() const { return sum_.size(); }  // 0 when in place
  void Zero();
  // sum[begin, end) += values[0, end - begin) (in place: values = their fixed-point value,
  // RoundToFixedPointInPlace), after rounding the values onto the block grid (RoundToBlockGrid,
  // in place, in pieces of `piece` from `begin`; [begin, end) is a layout-free run of a unit);
  // returns false (and adds nothing for those elements, or leaves them as they are in place) if
  // any value is non-finite or too large to represent, so the caller can find and report a
  // non-finite gradient.
  bool AddRange(size_t begin, size_t end, float* values, size_t piece = 0);
  __int128* data() { return sum_.data(); }

 private:
  std::vector<__int128> sum_;
  ExactGrid grid_;
  bool in_place_ = false;
};

// values[i] = the float of its fixed-point value, the bits of Int128ToFloat(FloatToInt128(v)):
// truncated at 2^-64 (toward zero, a zero result +0), rounded to float. False if any is
// non-finite or too large; those are left as they are.
bool RoundToFixedPointInPlace(float* values, size_t n);

// out[i] = the fixed-point value of in[i] (exact for |v| >= 2^-40); false if any is non-finite
// or too large (those elements are set to 0).
bool FloatToInt128(const float* in, __int128* out, size_t n);
// sum[i] += in[i].
void AddInt128(const __int128* in, __int128* sum, size_t n);

// Converts n fixed-point sums to float (int128 -> double -> float, round to nearest each).
void Int128ToFloat(const __int128* in, float* out, size_t n);

// One double to fixed point: *out = trunc(v 2^64) (exact for |v| >= 2^-12, a double's ULP being
// 2^-64 or more there). False, and *out = 0, for a non-finite v or |v| >= 2^62. For the few
// scalar sums of a step (GRPO's metrics), not for arrays.
bool DoubleToFixed(double v, __int128* out);
// A fixed-point sum back to the nearest double.
double FixedToDouble(__int128 sum);

}  // namespace crucible
