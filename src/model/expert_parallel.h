// Expert parallelism's token exchange (model/parallelism.h, ModelParallelism::ep_degree): the
// rows a rank routed to each expert travel to the expert's owner, and its results come back.
//
// A rank's routed rows are sorted by expert (moe_routing.h, expert_begin), so the rows for the
// owner of experts [q El, (q + 1) El) (El = experts / ep_degree) are one consecutive block:
// dispatch is one all-to-all(v) of blocks, combine the same in reverse. The owner holds what it
// received source by source, in the group's rank order, each source's rows in that source's
// expert order: group (s, e) of its products is source s's rows for its expert e, the same rows
// in the same order as source s would have at degree 1. A product over a group computes each
// group alone (kernels: grouped_matmul_*), so every row's output, and every weight gradient taken
// over one source's group, has the bits of degree 1; the owner adds each source's weight
// gradient as its own exact contribution (ParameterAccess::AddGradient). Every collective runs
// under the communicator's deadline and names the layer in a timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/parallelism.h"

namespace crucible {

// One MoE layer's exchange for one micro-batch, from its routing.
struct ExpertDispatch {
  // Rows this rank sends to each rank of the group and receives from each (counts of rows).
  std::vector<int64_t> send_rows, receive_rows;
  // Where rank q's block starts in this rank's expert-sorted rows.
  std::vector<int64_t> send_first;
  // The owner's groups, source-major: group s El + e holds rows [begin[s El + e],
  // begin[s El + e + 1]) of what it received (ep_degree El + 1 offsets).
  std::vector<int64_t> begin;
  int64_t received() const { return begin.empty() ? 0 : begin.back(); }
};

class ExpertParallelOps {
 public:
  // `experts`: the routed experts of a MoE layer (ep_degree > 1 divides it; internal error
  // otherwise: without expert parallelism nothing is exchanged).
  ExpertParallelOps(const ModelParallelism& parallelism, int64_t experts);

  int degree() const { return parallelism_.ep_degree; }
  int rank() const { return parallelism_.ep_rank; }

  // Exchanges each expert's row count: `expert_begin` (experts + 1 offsets) is this rank's
  // routing. `what` names the layer in a timeout message.
  ExpertDispatch Plan(const int64_t* expert_begin, const char* what);
  // Sends this rank's expert-sorted rows (`width` floats each) to their owners; `out` receives
  // plan.received() rows, source-major.
  void Dispatch(const ExpertDispatch& plan, const float* rows, float* out, int64_t width,
                const char* what);
  // The reverse: the owner's rows (source-major, as Dispatch left them) back to their sources,
  // into `out` in this rank's expert-sorted order.
  void Combine(const ExpertDispatch& plan, const float* rows, float* out, int64_t width,
               const char* what);

 private:
  void Exchange(const float* send, const std::vector<int64_t>& send_rows,
                const std::vector<int64_t>& send_first, float* receive,
                const std::vector<int64_t>& receive_rows, const std::vector<int64_t>& receive_first,
                int64_t width, const char* what);
  ModelParallelism parallelism_;
  int64_t experts_, local_;
};

}  // namespace crucible
