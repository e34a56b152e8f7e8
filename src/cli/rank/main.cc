// crucible-rank [--] COMMAND...: the per-rank wrapper of `crucible launch` as a small program of
// its own (same code as `crucible launch-rank`). The main binary links OpenBLAS, whose start-up
// costs every rank ~11 ms; this one starts in about a millisecond.
#include <string>
#include <vector>

#include "launch/rank_environment.h"

int main(int argc, char** argv) {
  int first = 1;
  if (first < argc && std::string(argv[first]) == "--") ++first;
  return crucible::ExecRank(std::vector<std::string>(argv + first, argv + argc));
}
