// The GRPO loop (`crucible grpo`): on-policy reinforcement learning with verifiable rewards, on
// the Trainer (train/trainer.h) through its StepBatches seam. Optimizer step k belongs to
// rollout step s = (k - 1) / grpo.iterations + 1; the first optimizer step of each rollout step:
//
//   prompts      grpo.prompts_per_step of them, a pure function of (debug.seed, s): line
//                (s - 1) * P + j of grpo.prompts (cycling), or the built-in task's problem of that
//                index (rl/rewards.h MakeProblem) when no file is given
//   rollouts     G = grpo.group_size completions per prompt, completion c = j * G + g of the
//                step's P * G, sampled by the generation engine (infer/engine.h) from the current
//                weights with request index c and seed f(debug.seed, s): its tokens do not
//                depend on the batching or the rank layout. Rank r of R samples the completions
//                [r N / R, (r + 1) N / R), N = P * G, as the DataLoader slices a global batch.
//   rewards      over the whole step, on every rank from the gathered completions (built-in
//                tasks), or the reward command on rank 0 over all N, its rewards broadcast
//   advantages   ComputeAdvantages over the N rewards (rl/grpo_loss.h), groups of G
//   ref logp     the initial weights' log-probabilities when grpo.beta > 0 (Trainer::
//                ScoreTargets, a forward pass of the reference)
// and every optimizer step (each of the grpo.iterations): logp at the current weights from the
// training forward itself (StepBatches::WeightsFromForward: the trainer hands each micro-batch's
// log-probabilities and logits to WeighMicroBatch between its forward and its backward), at the
// first iteration also the old logp (the rollout weights': the ratio is exactly 1, and no
// separate scoring pass runs), GrpoLoss per micro-batch, and the loss weights -dL/dlogp, which
// the Trainer's weighted cross-entropy backward turns into the GRPO gradient with normaliser 1.
// A row is prompt + completion tokens, inputs and targets shifted by one; only targets that are
// completion tokens count. The rows train sorted by length, each micro-batch at its longest
// row's length rounded up to 8 (Batch::micro_lengths), not padded to training.seq_len.
//
// Checkpoints (Trainer's, with StepBatches::CheckpointState in state.json's "step_batches"):
// the rollout step, the initial weights' source and xxh3 (a resumed run with grpo.beta > 0
// reloads the reference from that source and refuses to go on when its hash differs), and,
// after an optimizer step inside a rollout batch (grpo.iterations > 1), the batch itself: every
// completion's row, rewards and flags and its old and reference log-probabilities, bit for bit.
// A resume at a batch boundary regenerates the next batch (a pure function of the seed, the
// rollout step and the weights); one inside a batch restores it from the checkpoint, for any
// rank count. So a resumed run gives the uninterrupted run's bits.
//
// Every reduction across ranks is in one place, GrpoBatches::ReduceTotals and ReduceStep: exact
// sums (ExactGroupSum, fixed128 grid) over the data-parallel group of each rank's own
// contributions, per completion (tokens, rewards, flags, the policy's entropy from the training
// forward's logits) and per micro-batch (the GrpoLoss sums); the same bits at
// any rank count. The completions themselves are gathered to every rank, and every rank computes
// every group's advantages from its G rewards. debug.grpo_average_reduction (test only) averages
// the loss sums or the entropy sum over the ranks instead: what the GRPO smoke gate must catch.
#pragma once

#include "common/config.h"

namespace crucible {

// Runs `crucible grpo` to completion; the process exit code. UsageError (exit 2) for a bad
// [grpo] key, DataError (exit 65) for a bad prompts file or a failing reward command.
// `resume_mode` as `crucible train`'s --resume (auto, none, or a checkpoint folder).
int RunGrpo(Config config, const std::string& resume_mode = "auto");

}  // namespace crucible
