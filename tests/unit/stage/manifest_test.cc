// The pure parts of `crucible yeet`: manifests and what they say must be sent, the %N
// expansion of node-local paths, and the rewriting of a launched command's paths.
#include "stage/manifest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "launch/rank_environment.h"
#include "stage/node_paths.h"
#include "stage/yeet.h"

namespace crucible {
namespace {

ManifestEntry Entry(const std::string& path, uint64_t size, uint64_t hash) {
  ManifestEntry e;
  e.path = path;
  e.size = size;
  e.hash = hash;
  return e;
}

TEST(Manifest, OnlyFilesTheNodeLacksOrHoldsDifferentlyAreMissing) {
  const Manifest wanted = {Entry("a", 1, 11), Entry("b/c", 2, 22), Entry("d", 3, 33),
                           Entry("e", 4, 44)};
  const Manifest held = {Entry("a", 1, 11), Entry("b/c", 2, 99), Entry("e", 5, 44),
                         Entry("extra", 7, 77)};
  EXPECT_EQ(MissingEntries(wanted, held), (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(MissingEntries(wanted, {}), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_TRUE(MissingEntries(wanted, wanted).empty());
}

TEST(Manifest, RoundTripsThroughTextIncludingSpacesInNames) {
  Manifest m = {Entry("dir/with space.bin", 123, 0xdeadbeefcafef00dULL), Entry("z", 0, 0)};
  m[0].mode = 0755;
  const Manifest back = ParseManifest(SerializeManifest(m));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].path, "dir/with space.bin");
  EXPECT_EQ(back[0].size, 123u);
  EXPECT_EQ(back[0].hash, 0xdeadbeefcafef00dULL);
  EXPECT_EQ(back[0].mode, 0755u);
  EXPECT_EQ(ManifestHash(back), ManifestHash(m));
  m[1].hash = 1;
  EXPECT_NE(ManifestHash(back), ManifestHash(m));
  EXPECT_THROW(ParseManifest("not a manifest line\n"), Error);
}

TEST(Manifest, ScansSourcesUnderTheirBaseNamesAndSeesOneChangedFile) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("yeet-manifest-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "data" / "sub");
  std::ofstream(root / "data" / "one.txt") << "one";
  std::ofstream(root / "data" / "sub" / "two.txt") << "two";
  std::ofstream(root / "tok.json") << "{}";
  const std::vector<std::string> sources = {(root / "data").string() + "/",
                                            (root / "tok.json").string()};
  uint64_t read = 0;
  const Manifest before = ScanSources(sources, &read);
  ASSERT_EQ(before.size(), 3u);
  EXPECT_EQ(before[0].path, "data/one.txt");
  EXPECT_EQ(before[1].path, "data/sub/two.txt");
  EXPECT_EQ(before[2].path, "tok.json");
  EXPECT_EQ(read, 8u);
  std::ofstream(root / "data" / "sub" / "two.txt") << "TWO!";
  const Manifest after = ScanSources(sources);
  EXPECT_EQ(MissingEntries(after, before), (std::vector<size_t>{1}));
  EXPECT_THROW(ScanSources({(root / "data").string(), (root / "data").string()}), Error);
  fs::remove_all(root);
}

TEST(HashCache, AnUnchangedFileIsNotReadAgainAndAChangedOneIs) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("yeet-cache-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "tree");
  std::ofstream(root / "tree" / "a.bin") << "alpha";
  std::ofstream(root / "tree" / "b.bin") << "bravo";
  const struct timespec an_hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  for (const char* name : {"a.bin", "b.bin"})
    ASSERT_EQ(utimensat(AT_FDCWD, (root / "tree" / name).c_str(), an_hour_ago, 0), 0);
  const std::string index = (root / "cache" / "node.index").string();
  uint64_t read = 0;
  {
    HashCache cache(index, HashCache::kNodeTree);
    const Manifest first = ScanTree((root / "tree").string(), &read, &cache);
    EXPECT_EQ(read, 10u);
    cache.Save();
  }
  HashCache cache(index, HashCache::kNodeTree);
  read = 0;
  const Manifest again = ScanTree((root / "tree").string(), &read, &cache);
  EXPECT_EQ(read, 0u);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(SerializeManifest(again), SerializeManifest(ScanTree((root / "tree").string())));
  std::ofstream(root / "tree" / "b.bin") << "BRAVO";  // same size, new mtime
  HashCache after(index, HashCache::kNodeTree);
  read = 0;
  const Manifest changed = ScanTree((root / "tree").string(), &read, &after);
  EXPECT_EQ(read, 5u);
  EXPECT_EQ(MissingEntries(changed, again), (std::vector<size_t>{1}));
  // A source file changed within the last 2 s is not remembered (it may change again unseen).
  HashCache sources((root / "cache" / "sources.index").string(), HashCache::kSources);
  ScanSources({(root / "tree" / "b.bin").string()}, nullptr, &sources);
  sources.Save();
  HashCache reloaded((root / "cache" / "sources.index").string(), HashCache::kSources);
  read = 0;
  ScanSources({(root / "tree" / "b.bin").string()}, &read, &reloaded);
  EXPECT_EQ(read, 5u);
  fs::remove_all(root);
}

TEST(NodePaths, SbcastLandsBesideTheDestinationUnlessItsFolderNamesTheNode) {
  EXPECT_EQ(SbcastStagingPath("/local/job-%N", "12-ab-1"), "/local/.crucible-yeet-12-ab-1.sbcast");
  EXPECT_EQ(SbcastStagingPath("/local/%N/job/", "7"), "/tmp/.crucible-yeet-7.sbcast");
}

TEST(NodePaths, PercentNBecomesTheNodeName) {
  EXPECT_EQ(ExpandNodeName("/tmp/job-%N/data", "n3"), "/tmp/job-n3/data");
  EXPECT_EQ(ExpandNodeName("%N-%N", "a"), "a-a");
  EXPECT_EQ(ExpandNodeName("100%% of %N%", "n1"), "100% of n1%");
  EXPECT_EQ(ExpandNodeName("no pattern", "n1"), "no pattern");
}

TEST(NodePaths, ArchivesUnpackIntoTheirNameWithoutExtension) {
  EXPECT_EQ(ArchiveStem("tok.tar.gz"), "tok");
  EXPECT_EQ(ArchiveStem("sub/env.tar.zst"), "sub/env");
  EXPECT_EQ(ArchiveStem("a.tgz"), "a");
  EXPECT_EQ(ArchiveStem("b.tar"), "b");
  EXPECT_EQ(StagedName("/shared/data/"), "data");
  EXPECT_EQ(StagedName("tok.json"), "tok.json");
}

TEST(NodePaths, ArgumentsUnderASourcePointAtTheStagedCopy) {
  const std::vector<std::string> sources = {"/shared/data", "tok.json"};
  const std::vector<std::string> rewritten = RewriteArguments(
      {"train", "/shared/data", "/shared/data/shard-0.bin", "--set", "data.path=/shared/data/x",
       "/shared/database", "tok.json", "--tok=tok.json", "other=/elsewhere"},
      sources, "/tmp/job-%N");
  EXPECT_EQ(rewritten,
            (std::vector<std::string>{"train", "/tmp/job-%N/data", "/tmp/job-%N/data/shard-0.bin",
                                      "--set", "data.path=/tmp/job-%N/data/x", "/shared/database",
                                      "/tmp/job-%N/tok.json", "--tok=/tmp/job-%N/tok.json",
                                      "other=/elsewhere"}));
}

TEST(YeetFailSwitch, FailsTheNamedNodeForItsFirstTriesOrAlways) {
  EXPECT_TRUE(YeetFailureInjected("n2:1,n3:always", "n2", 1));
  EXPECT_FALSE(YeetFailureInjected("n2:1,n3:always", "n2", 2));
  EXPECT_TRUE(YeetFailureInjected("n2:1,n3:always", "n3", 3));
  EXPECT_FALSE(YeetFailureInjected("n2:1,n3:always", "n1", 1));
  EXPECT_THROW(YeetFailureInjected("n2", "n2", 1), Error);
  EXPECT_THROW(YeetFailureInjected("n2:0", "n2", 1), Error);
}

}  // namespace
}  // namespace crucible
