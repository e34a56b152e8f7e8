// Targets sampled from a model's own predictions, for the Hessian pass of an optimizer with a
// Hessian estimate (optim/optimizer.h, hessian_interval): the Gauss-Newton-Bartlett estimator of
// SophiaG draws each position's label from softmax(logits) at temperature 1.
//
// Deterministic: the draw of position t of global sample s at step `step` is a pure function of
// (seed, step, s, t) and of that position's logits (Philox, common/philox.h), so it does not
// depend on the rank layout, the micro-batch cut or the thread count.
#pragma once

#include <cstdint>

namespace crucible {

// For rows [0, rows) of a micro-batch whose row 0 is global sample `first_sample`: writes to
// out[i] (rows x seq_len) a label drawn from softmax(logits[i, 0..vocab)), or -1 where
// targets[i] < 0 (a position the loss ignores stays ignored). The softmax and the draw are in
// double, the vocabulary walked in index order.
void SampleTargets(const float* logits, const int32_t* targets, int64_t rows, int64_t seq_len,
                   int64_t vocab, uint64_t seed, int64_t step, int64_t first_sample, int32_t* out);

}  // namespace crucible
