#include "launch/hostlist.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "common/error.h"

namespace crucible {
namespace {

using Hosts = std::vector<std::string>;

TEST(HostList, ExpandsLikeScontrolShowHostnames) {
  EXPECT_EQ(ExpandHostList("n[1-3],x5"), (Hosts{"n1", "n2", "n3", "x5"}));
  EXPECT_EQ(ExpandHostList("gpu[08-10]"), (Hosts{"gpu08", "gpu09", "gpu10"}));
  EXPECT_EQ(ExpandHostList("n[1,3-4]-ib"), (Hosts{"n1-ib", "n3-ib", "n4-ib"}));
  EXPECT_EQ(ExpandHostList("r[1-2]n[1-2]"), (Hosts{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(ExpandHostList("single"), (Hosts{"single"}));
  EXPECT_EQ(ExpandHostList("x1000c0s[0-1]b0n0"), (Hosts{"x1000c0s0b0n0", "x1000c0s1b0n0"}));
}

TEST(HostList, RejectsMalformedLists) {
  EXPECT_THROW(ExpandHostList("n[1-3"), Error);
  EXPECT_THROW(ExpandHostList("n1-3]"), Error);
  EXPECT_THROW(ExpandHostList("n[3-1]"), Error);
  EXPECT_THROW(ExpandHostList("n[a-b]"), Error);
}

TEST(HostList, NormalisesCaseDomainAndPunctuation) {
  EXPECT_EQ(NormalizeHost("N2.cluster.example.org:"), "n2");
  EXPECT_EQ(NormalizeHost(" [nid001234] "), "nid001234");
  EXPECT_EQ(NormalizeHost("10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(FindHost({"n1", "n2"}, "N2.local"), 1);
  EXPECT_EQ(FindHost({"n1", "n2"}, "n3"), -1);
}

TEST(HostList, ReadsPbsNodeFileOncePerHost) {
  const std::string path = testing::TempDir() + "/nodefile";
  std::ofstream(path)
      << "x1.hsn.example\nx1.hsn.example\n# comment\nx2.hsn.example slots=2\n\nx3:4\n";
  EXPECT_EQ(ReadHostFile(path), (Hosts{"x1.hsn.example", "x2.hsn.example", "x3"}));
  EXPECT_THROW(ReadHostFile(testing::TempDir() + "/missing-nodefile"), Error);
  std::ofstream(path) << "# nothing\n";
  EXPECT_THROW(ReadHostFile(path), Error);
}

}  // namespace
}  // namespace crucible
