// Global-norm gradient clipping.
#pragma once

namespace crucible {

// Scale factor for global-norm clipping as torch.nn.utils.clip_grad_norm_ computes it:
// max_norm / (norm + 1e-6) when that is below 1, else 1 (and 1 when max_norm <= 0).
float ClipScale(double grad_norm, double max_norm);

}  // namespace crucible
