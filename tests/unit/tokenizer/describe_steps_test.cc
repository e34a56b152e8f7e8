#include "tokenizer/describe_steps.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace crucible {
namespace {

struct Named {
  std::string name;
  std::string Describe() const { return name; }
};

TEST(DescribeSteps, NamesNoStepsOneStepOrASequenceAsTokenizerJsonNestsThem) {
  std::vector<std::unique_ptr<Named>> steps;
  EXPECT_EQ(DescribeSteps(steps), "none");
  steps.push_back(std::make_unique<Named>(Named{"NFC"}));
  EXPECT_EQ(DescribeSteps(steps), "NFC");
  steps.push_back(std::make_unique<Named>(Named{"Lowercase"}));
  EXPECT_EQ(DescribeSteps(steps), "Sequence[NFC,Lowercase]");
}

}  // namespace
}  // namespace crucible
