#include "optim/clipping.h"

#include <cmath>

namespace crucible {

float ClipScale(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(grad_norm)) return 1.0f;
  double coefficient = max_norm / (grad_norm + 1e-6);
  return coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
}

}  // namespace crucible
