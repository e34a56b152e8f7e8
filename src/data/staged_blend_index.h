// The blend index of a run in stages ([[data.stages]]): for every global sample, which dataset
// it comes from and that dataset's running sample number, over the datasets of every stage
// together. Stage k owns the samples [A_k, A_k + samples_k) after those of the stages before it.
//
//  - The steady part of a stage (all of it, or what follows its anneal) is the quota method of
//    blend_index.h on the stage's own weights, its counts started at zero where the part starts:
//    at every prefix of the part, every dataset is within one sample of the stage's weights.
//  - The anneal (the stage's first anneal_samples samples) moves the weights linearly from the
//    previous stage's shares p to this stage's shares q, per sample: sample j of the anneal
//    (from 0) has the weights w_j = p + (q - p)(j + 1/2)/N, N = anneal_samples, and the
//    cumulative target of the first n samples is
//        L_d(n) = sum_{j<n} w_j(d) = n p_d + (q_d - p_d) n^2 / (2N).
//    The anneal is the quota method generalised to those targets: at slot n dataset d may take
//    one more sample when c_d < L_d(n + 1) (its upper quota), and of those the one whose next
//    sample is due first takes it: the real t where L_d(t) = c_d + 1, L_d taken linear between
//    whole n (ties to the lower index; not due within the anneal is last). That is earliest-
//    deadline-first over unit jobs whose release and deadline intervals satisfy Hall's condition
//    (the targets of any window add up to its length), so no deadline is missed: at every prefix
//    n of the anneal, |c_d(n) - L_d(n)| < 1 for every dataset (docs/data.md). With p = q the
//    rule is the quota method's (its due times computed another way, so near-ties may break
//    differently).
//  - A dataset's running number counts its samples from the start of the run, across stages, so
//    a stage that reads a dataset again goes on through its epochs instead of starting over.
//
// Everything is a pure function of (the stages' weights and lengths, n): no rank, thread or
// resume point enters it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace crucible {

// One stage over the union of the datasets of every stage (D of them).
struct StageMixture {
  int64_t samples = 0;         // the stage's samples
  int64_t anneal_samples = 0;  // its first this many anneal from the previous stage's shares
  // Per dataset of the union: the weight as its file list gives it (a blend of blends: the
  // combined weight, BlendStageOptions::blends), 0 where the stage does not list the dataset (at
  // least one positive).
  std::vector<double> weights;
};

// Fills dataset_index and dataset_sample for the stages' samples together (sum of samples).
// The first stage must not anneal. `heartbeat`, when set, is called every few million samples
// with the samples done.
void BuildStagedBlendIndex(const std::vector<StageMixture>& stages, uint16_t* dataset_index,
                           int64_t* dataset_sample,
                           const std::function<void(int64_t)>& heartbeat = nullptr);

// The anneal alone: `from` and `to` are shares over the same D datasets (each summing to 1,
// non-negative); fills dataset_index[0, n) for n anneal samples. Exposed for tests.
void BuildAnnealIndex(const std::vector<double>& from, const std::vector<double>& to, int64_t n,
                      uint16_t* dataset_index);

// L_d(m): the cumulative target of the first m samples of an anneal of n samples from share
// `from` to share `to` (above).
double AnnealTarget(double from, double to, int64_t n, int64_t m);

}  // namespace crucible
