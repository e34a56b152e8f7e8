#include "model/expert_parallel.h"

#include <algorithm>

#include "common/error.h"
#include "common/profile.h"
#include "common/strings.h"
#include "common/timer.h"
#include "distributed/communicator.h"

namespace crucible {

ExpertParallelOps::ExpertParallelOps(const ModelParallelism& parallelism, int64_t experts)
    : parallelism_(parallelism), experts_(experts) {
  const int ep = parallelism.ep_degree;
  if (ep < 2 || experts % ep != 0 || !parallelism.expert_parallel)
    throw Error(kExitFailure,
                StrFormat("internal: %lld experts over an expert-parallel group of %d",
                          (long long)experts, ep));
  local_ = experts / ep;
}

ExpertDispatch ExpertParallelOps::Plan(const int64_t* expert_begin, const char* what) {
  const int ep = degree();
  const size_t El = static_cast<size_t>(local_);
  // counts[q El + e]: this rank's rows for rank q's expert e.
  std::vector<int64_t> counts(static_cast<size_t>(experts_)), received(counts.size());
  for (int64_t e = 0; e < experts_; ++e) counts[e] = expert_begin[e + 1] - expert_begin[e];
  ExpertDispatch plan;
  plan.send_rows.resize(ep);
  plan.send_first.resize(ep);
  for (int q = 0; q < ep; ++q) {
    plan.send_first[q] = expert_begin[q * local_] - expert_begin[0];
    plan.send_rows[q] = expert_begin[(q + 1) * local_] - expert_begin[q * local_];
  }
  {
    const Timer timer;
    ScopedKernelTimer profile_timer("expert_parallel_exchange", 0, 8.0 * counts.size());
    parallelism_.expert_parallel->AllToAll(counts.data(), received.data(), El, what);
    if (ExchangeTraffic* traffic = parallelism_.expert_traffic)
      traffic->Add(8.0 * static_cast<double>(El) * (ep - 1), timer.Seconds());
  }
  plan.receive_rows.assign(ep, 0);
  plan.begin.assign(static_cast<size_t>(ep) * El + 1, 0);
  for (int s = 0; s < ep; ++s)
    for (size_t e = 0; e < El; ++e) {
      const size_t g = static_cast<size_t>(s) * El + e;
      if (received[g] < 0)
        throw Error(kExitFailure, std::string("internal: a negative row count in ") + what);
      plan.begin[g + 1] = plan.begin[g] + received[g];
      plan.receive_rows[s] += received[g];
    }
  return plan;
}

void ExpertParallelOps::Exchange(const float* send, const std::vector<int64_t>& send_rows,
                                 const std::vector<int64_t>& send_first, float* receive,
                                 const std::vector<int64_t>& receive_rows,
                                 const std::vector<int64_t>& receive_first, int64_t width,
                                 const char* what) {
  const int ep = degree();
  Communicator::Blocks out, in;
  for (int q = 0; q < ep; ++q) {
    out.counts.push_back(static_cast<size_t>(send_rows[q] * width));
    out.offsets.push_back(static_cast<size_t>(send_first[q] * width));
    in.counts.push_back(static_cast<size_t>(receive_rows[q] * width));
    in.offsets.push_back(static_cast<size_t>(receive_first[q] * width));
  }
  double others = 0;
  for (int q = 0; q < ep; ++q)
    if (q != rank()) others += static_cast<double>(in.counts[q]);
  const Timer timer;
  {
    ScopedKernelTimer profile_timer("expert_parallel_exchange", 0, 4.0 * others);
    parallelism_.expert_parallel->AllToAllV(send, out, receive, in, what);
  }
  if (ExchangeTraffic* traffic = parallelism_.expert_traffic)
    traffic->Add(4.0 * others, timer.Seconds());
}

namespace {
std::vector<int64_t> Starts(const std::vector<int64_t>& rows) {
  std::vector<int64_t> first(rows.size(), 0);
  for (size_t q = 1; q < rows.size(); ++q) first[q] = first[q - 1] + rows[q - 1];
  return first;
}
}  // namespace

void ExpertParallelOps::Dispatch(const ExpertDispatch& plan, const float* rows, float* out,
                                 int64_t width, const char* what) {
  Exchange(rows, plan.send_rows, plan.send_first, out, plan.receive_rows, Starts(plan.receive_rows),
           width, what);
}

void ExpertParallelOps::Combine(const ExpertDispatch& plan, const float* rows, float* out,
                                int64_t width, const char* what) {
  Exchange(rows, plan.receive_rows, Starts(plan.receive_rows), out, plan.send_rows, plan.send_first,
           width, what);
}

}  // namespace crucible
