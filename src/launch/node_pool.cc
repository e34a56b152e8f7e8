#include "launch/node_pool.h"

#include <algorithm>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

NodePool::NodePool(const std::vector<std::string>& allocated, int active_count, int spare_count) {
  const int total = static_cast<int>(allocated.size());
  if (active_count < 1) throw UsageError("at least one node must be active");
  if (active_count > total)
    throw UsageError(
        StrFormat("%d node(s) asked for, but the allocation has only %d", active_count, total));
  const int leftover = total - active_count;
  if (spare_count > leftover)
    throw UsageError(
        StrFormat("%d active node(s) and %d spare(s) asked for, but the allocation "
                  "has only %d node(s)",
                  active_count, spare_count, total));
  const int spares = spare_count < 0 ? leftover : spare_count;
  active_.assign(allocated.begin(), allocated.begin() + active_count);
  spares_.assign(allocated.begin() + active_count, allocated.begin() + active_count + spares);
}

std::string NodePool::Swap(const EvictedNode& record) {
  auto position = std::find(active_.begin(), active_.end(), record.node);
  if (position == active_.end() || spares_.empty()) return "";
  std::string replacement = spares_.front();
  spares_.erase(spares_.begin());
  *position = replacement;
  evicted_.push_back(record);
  just_swapped_in_.erase(record.node);
  swapped_this_round_.insert(replacement);
  return replacement;
}

void NodePool::NewAttempt() {
  just_swapped_in_ = swapped_this_round_;
  swapped_this_round_.clear();
}

void NodePool::CountFailure(const std::vector<std::string>& nodes) {
  for (const std::string& node : nodes) ++failures_[node];
}

std::string NodePool::BlindCandidate() const {
  std::string best;
  int best_failures = -1;
  for (const std::string& node : active_) {
    if (just_swapped_in_.count(node)) continue;
    auto it = failures_.find(node);
    int count = it == failures_.end() ? 0 : it->second;
    if (count > best_failures) {
      best = node;
      best_failures = count;
    }
  }
  return best;
}

}  // namespace crucible
