// Exact gradient accumulation. Each micro-batch's float gradient is converted to 128-bit fixed
// point (binary point at 2^-64) and added as integers. Integer addition is associative, so the
// sum does not depend on the order of micro-batches, threads or ranks: DP=1 with gradient
// accumulation and DP=4 without produce the same bits. Values with |g| >= 2^-40 convert
// exactly; smaller ones are truncated at 2^-64 (5.4e-20 absolute); |g| must stay below 2^62.
// The total converts back to float once per step (int128 -> double -> float, both rounded to
// nearest).
#pragma once

#include <cstddef>
#include <vector>

namespace crucible {

class ExactAccumulator {
 public:
  explicit ExactAccumulator(size_t size) : sum_(size) {}
  size_t size() const { return sum_.size(); }
  void Zero();
  // sum[begin, end) += values[0, end - begin); returns false (and adds nothing for those
  // elements) if any value is non-finite or too large to represent, so the caller can report a
  // non-finite gradient.
  bool AddRange(size_t begin, size_t end, const float* values);
  __int128* data() { return sum_.data(); }

 private:
  std::vector<__int128> sum_;
};

// out[i] = the fixed-point value of in[i] (exact for |v| >= 2^-40); false if any is non-finite
// or too large (those elements are set to 0).
bool FloatToInt128(const float* in, __int128* out, size_t n);
// sum[i] += in[i].
void AddInt128(const __int128* in, __int128* sum, size_t n);

// Converts n fixed-point sums to float (int128 -> double -> float, round to nearest each).
void Int128ToFloat(const __int128* in, float* out, size_t n);

}  // namespace crucible
