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
#pragma once

#include <cstddef>
#include <vector>

namespace crucible {

class ExactAccumulator {
 public:
  explicit ExactAccumulator(size_t size) : sum_(size) {}
  // For one contribution per element per step (one rank, one micro-batch): no sums are kept;
  // AddRange rounds the values in place, and they are then the step's gradients.
  static ExactAccumulator InPlace() {
    ExactAccumulator a(0);
    a.in_place_ = true;
    return a;
  }
  bool in_place() const { return in_place_; }
  size_t size() const { return sum_.size(); }  // 0 when in place
  void Zero();
  // sum[begin, end) += values[0, end - begin) (in place: values = their fixed-point value,
  // RoundToFixedPointInPlace); returns false (and adds nothing for those elements, or leaves them
  // as they are in place) if any value is non-finite or too large to represent, so the caller can
  // find and report a non-finite gradient.
  bool AddRange(size_t begin, size_t end, float* values);
  __int128* data() { return sum_.data(); }

 private:
  std::vector<__int128> sum_;
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

}  // namespace crucible
