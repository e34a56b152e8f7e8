// A sum of squares that does not depend on how its elements are laid out over ranks: the
// gradient norm of a tensor-parallel run, whose ranks hold different parts of each tensor at
// each degree (docs/parallelism.md).
//
// Every square g^2 of a float is exact in double. They are added as integers on one grid that
// every rank of the group agrees on: the largest |g| of all ranks (its float exponent, one byte,
// max-reduced) sets the grid at 2^-97 of the largest square, each square is truncated to it
// and summed in 128 bits (room for 2^30 elements), and the integers are all-reduced. Integer
// addition is associative, so any partition of the elements over ranks and any order give the
// same bits. What is rounded: squares below 2^-97 of the largest, each by less than one grid
// step (at most 2^-67 of the sum for 2^30 elements).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace crucible {

class Communicator;

// The sum of static_cast<__int128>(values[i]^2 * scale) over n <= kSquaresBlock values, for a
// power of two `scale` that keeps each product below 2^97: the same integer, in a loop that
// vectorises (the compiler's conversion to 128 bits is a library call per element).
inline constexpr size_t kSquaresBlock = size_t{1} << 14;
__int128 TruncatedSquaresSum(const float* values, size_t n, double scale);

// The sum over every rank of `group` of values[i - base]^2 for i in each of this rank's
// `ranges` ([begin, end) flat indices). NaN when any of them is not finite (on every rank).
double LayoutFreeSumOfSquares(const float* values, size_t base,
                              const std::vector<std::pair<size_t, size_t>>& ranges,
                              Communicator& group);

}  // namespace crucible
