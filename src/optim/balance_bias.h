// The balance rule of ParamKind::kBalanceBias tensors, which no optimizer trains: a mixture of
// experts' per-expert routing bias (DeepSeek-V3's auxiliary-loss-free load balancing, Wang et
// al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"). The model
// writes in the bias's gradient slot each expert's share of the micro-batch's token slots minus
// the uniform share 1/E; reduced like every gradient (summed over micro-batches and ranks), it is
// the global load's deviation from the mean, up to a positive factor. The update is
//     b_i <- b_i - speed * sign(g_i)        (sign(0) = 0)
// so an overloaded expert's bias falls and an idle one's rises by `speed` a step, whatever the
// learning rate schedule. Elementwise, no state, no weight decay.
//
// WithBalanceBias wraps any optimizer: it passes every other tensor to it and keeps its states
// off the balance biases (StateSpec::carried_by), so a model without them sees the optimizer
// unchanged (state, checkpoints, bits).
#pragma once

#include <memory>

#include "optim/optimizer.h"

namespace crucible {

std::unique_ptr<Optimizer> WithBalanceBias(std::shared_ptr<const Optimizer> optimizer,
                                           double speed);

}  // namespace crucible
