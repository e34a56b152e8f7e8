// The nodes of a launch: the active ones ranks run on, the spares waiting, and the ones taken
// out (named by the log or the scheduler, or evicted blindly). Swapping puts the first spare in
// the evicted node's place, so the other ranks keep their positions.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace crucible {

struct EvictedNode {
  std::string node;
  bool named = true;  // false: a blind swap (no evidence named it)
  int attempt = 0;
  std::string verdict;
  std::string evidence;
};

class NodePool {
 public:
  // The first `active_count` allocated nodes are active; the next `spare_count` (all the rest
  // when negative) are spares. Throws UsageError when the allocation is too small.
  NodePool(const std::vector<std::string>& allocated, int active_count, int spare_count);

  const std::vector<std::string>& active() const { return active_; }
  const std::vector<std::string>& spares() const { return spares_; }
  const std::vector<EvictedNode>& evicted() const { return evicted_; }
  // Nodes swapped in by the last swap (and not evicted since).
  const std::set<std::string>& just_swapped_in() const { return just_swapped_in_; }

  // Replaces `record.node` with the first spare; returns the spare, or "" when none is left
  // (the pool is then unchanged).
  std::string Swap(const EvictedNode& record);

  // Marks the start of a new attempt: nodes swapped in before it are no longer "just" in.
  void NewAttempt();
  void CountFailure(const std::vector<std::string>& nodes);

  // The node a blind swap evicts: never one just swapped in; among the rest, the one that took
  // part in the most failed attempts, the first in rank order on a tie. "" when none qualifies.
  std::string BlindCandidate() const;

 private:
  std::vector<std::string> active_, spares_;
  std::vector<EvictedNode> evicted_;
  std::set<std::string> just_swapped_in_, swapped_this_round_;
  std::map<std::string, int> failures_;
};

}  // namespace crucible
