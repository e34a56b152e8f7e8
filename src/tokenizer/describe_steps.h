// How a tokenizer pipeline (normalizer, pre-tokenizer) names its steps in `tokenizer info` and
// in errors: "none", the one step's name, or "Sequence[a,b,...]" as tokenizer.json nests them.
#pragma once

#include <string>

namespace crucible {

template <class Steps>  // a container of pointers to steps with a Describe() const
std::string DescribeSteps(const Steps& steps) {
  if (steps.empty()) return "none";
  if (steps.size() == 1) return steps[0]->Describe();
  std::string out = "Sequence[";
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i) out += ',';
    out += steps[i]->Describe();
  }
  return out + "]";
}

}  // namespace crucible
