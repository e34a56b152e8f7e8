// The GEMM ceiling (train/gemm_ceiling.h): which shapes a model's products have, and the cache
// that makes the ceiling a once-per-machine measurement.
#include "train/gemm_ceiling.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/files.h"
#include "model/model.h"
#include "support/tiny_training.h"

namespace crucible {
namespace {

ParameterTable TinyTable(bool tied) {
  Config config = test_support::TinyTrainingConfig("/tmp/unused", 1);
  config.ApplyOverride(std::string("model.tie_embeddings=") + (tied ? "true" : "false"));
  return BuildModelSpec(config)->BuildTable();
}

TEST(GemmCeiling, TheShapesAreTheModelsDistinctProductsWithRowsCappedAt1024) {
  // dim 16, 2 x 1 heads of 8, ffn 32, vocab 64: q/o 16x16, k/v 16->8, gate/up 16->32, down 32->16,
  // the head 16->64 (a separate head, or the embedding where it is tied).
  const std::vector<GemmShape> expected = {
      {32, 16, 16}, {32, 16, 8}, {32, 16, 32}, {32, 32, 16}, {32, 16, 64}};
  for (bool tied : {false, true}) {
    std::vector<GemmShape> shapes = ModelGemmShapes(TinyTable(tied), 32);
    std::sort(shapes.begin(), shapes.end(), [](const GemmShape& a, const GemmShape& b) {
      return std::tie(a.in, a.out) < std::tie(b.in, b.out);
    });
    std::vector<GemmShape> sorted = expected;
    std::sort(sorted.begin(), sorted.end(), [](const GemmShape& a, const GemmShape& b) {
      return std::tie(a.in, a.out) < std::tie(b.in, b.out);
    });
    EXPECT_EQ(shapes, sorted) << "tied=" << tied;
  }
  for (const GemmShape& s : ModelGemmShapes(TinyTable(false), 1 << 20)) EXPECT_EQ(s.rows, 1024);
}

TEST(GemmCeiling, AMeasurementIsCachedUnderItsKeyAndOtherEntriesStay) {
  const std::string dir = "/tmp/crucible-gemm-ceiling-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string path = dir + "/sub/gemm-ceiling.json";
  const std::vector<GemmShape> shapes = {{64, 32, 48}};
  const std::string key = GemmCeilingKey(1, shapes);
  EXPECT_NE(key.find("threads="), std::string::npos);
  // v3: entries keyed without the CPU's family and model (v2 and before) are not reused.
  EXPECT_EQ(key.rfind("v3;", 0), 0u) << key;
  // Two CPUs of one model name and feature list can differ 2x in the ceiling (an "AMD EPYC" VM
  // on Zen 4 and on Zen 5: 205.7 and 432.7 GFLOP/s), so the key names the family and model.
  EXPECT_NE(key.find(";family="), std::string::npos) << key;
  EXPECT_NE(key.find(";model="), std::string::npos) << key;
  EXPECT_NE(key.find(";onednn="), std::string::npos) << key;
  EXPECT_NE(key.find(";gemm=auto;"), std::string::npos) << key;
  EXPECT_NE(key.find(";shapes=64x32x48"), std::string::npos) << key;
  EXPECT_NE(key, GemmCeilingKey(2, shapes));     // ranks sharing the host change the share
  EXPECT_EQ(LookupGemmCeiling(path, key), 0.0);  // no file yet
  const double measured = MeasureAndCacheGemmCeiling(shapes, path, key);
  EXPECT_GT(measured, 0.0);
  EXPECT_EQ(LookupGemmCeiling(path, key), measured);
  const double other = MeasureAndCacheGemmCeiling({{64, 48, 32}}, path, "other");
  EXPECT_EQ(LookupGemmCeiling(path, key), measured);  // still there
  EXPECT_EQ(LookupGemmCeiling(path, "other"), other);
  const nlohmann::json cache = nlohmann::json::parse(ReadFile(path));
  EXPECT_TRUE(cache.at(key).contains("measured_at"));
  EXPECT_TRUE(cache.at(key).at("shapes").contains("64x32x48"));
  std::filesystem::remove_all(dir);
}

// A measurement can only come out too low (the machine busy, or in a slower phase: a 2-core VM
// measured 432 GFLOP/s one afternoon and 498 that night), so measuring again keeps the higher of
// the cached and the new value, overall and per shape; it never lowers a ceiling.
TEST(GemmCeiling, MeasuringAgainKeepsTheHigherCeilingPerShapeAndOverall) {
  const std::string dir = "/tmp/crucible-gemm-ceiling-again-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/gemm-ceiling.json";
  const std::vector<GemmShape> shapes = {{64, 32, 48}, {64, 48, 32}};
  auto write = [&](double gflops, double first, double second) {
    nlohmann::json cache;
    cache["k"] = {{"gflops", gflops},
                  {"measured_at", "2026-01-01T00:00:00Z"},
                  {"shapes", {{"64x32x48", first}, {"64x48x32", second}}}};
    std::ofstream(path) << cache.dump();
  };
  // Cached too low (1 MFLOP/s): the new measurement replaces it.
  write(1e-3, 1e-3, 1e-3);
  const double again = MeasureAndCacheGemmCeiling(shapes, path, "k");
  EXPECT_GT(again, 1e-3);
  EXPECT_EQ(LookupGemmCeiling(path, "k"), again);
  nlohmann::json cache = nlohmann::json::parse(ReadFile(path));
  EXPECT_NE(cache["k"]["measured_at"], "2026-01-01T00:00:00Z");
  EXPECT_GT(cache["k"]["shapes"]["64x32x48"].get<double>(), 1e-3);
  // Cached higher than any machine reaches for one shape: that shape and the ceiling stay, the
  // other shape takes the new measurement.
  write(1e9, 1e9, 1e-3);
  EXPECT_EQ(MeasureAndCacheGemmCeiling(shapes, path, "k"), 1e9);
  EXPECT_EQ(LookupGemmCeiling(path, "k"), 1e9);
  cache = nlohmann::json::parse(ReadFile(path));
  EXPECT_EQ(cache["k"]["shapes"]["64x32x48"].get<double>(), 1e9);
  EXPECT_GT(cache["k"]["shapes"]["64x48x32"].get<double>(), 1e-3);
  EXPECT_LT(cache["k"]["shapes"]["64x48x32"].get<double>(), 1e9);
  std::filesystem::remove_all(dir);
}

// Two CPUs with one model name and one feature list (this VM type on Zen 4 and on Zen 5) get
// different keys, from the first processor's fields; missing fields have placeholders.
TEST(GemmCeiling, TheCpuKeyTellsCpusOfOneNameAndFeatureListApart) {
  auto key = [](const std::string& family, const std::string& model) {
    std::istringstream cpuinfo(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: " + family +
        "\nmodel\t\t: " + model +
        "\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
        "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 avx512vl\n\n"
        "processor\t: 1\ncpu family\t: 99\nmodel\t\t: 98\nmodel name\t: Other\n"
        "stepping\t: 97\nflags\t\t: fpu\n");
    return GemmCeilingCpuKey(cpuinfo);
  };
  EXPECT_EQ(key("25", "17"),
            "cpu=AMD EPYC;family=25;model=17;stepping=1;features=avx2,fma,avx512f,avx512_bf16");
  EXPECT_EQ(key("26", "2"),
            "cpu=AMD EPYC;family=26;model=2;stepping=1;features=avx2,fma,avx512f,avx512_bf16");
  std::istringstream empty("");
  EXPECT_EQ(GemmCeilingCpuKey(empty), "cpu=unknown;family=?;model=?;stepping=?;features=");
  // This machine's key carries its own CPU part.
  std::ifstream cpuinfo("/proc/cpuinfo");
  EXPECT_NE(GemmCeilingKey(1, {{64, 32, 48}}).find("v3;" + GemmCeilingCpuKey(cpuinfo) + ";blas="),
            std::string::npos);
}

TEST(GemmCeiling, AnUnreadableCacheIsAWarningAndAMeasurementNeverAFailure) {
  const std::string dir = "/tmp/crucible-gemm-ceiling-bad-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/gemm-ceiling.json";
  std::ofstream(path) << "{ not json";
  testing::internal::CaptureStderr();
  EXPECT_EQ(LookupGemmCeiling(path, "k"), 0.0);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("unreadable"), std::string::npos);
  EXPECT_GT(MeasureAndCacheGemmCeiling({{16, 16, 16}}, path, "k"), 0.0);  // rewritten
  EXPECT_GT(LookupGemmCeiling(path, "k"), 0.0);
  // A cache that cannot be written: the value is still returned, with a warning.
  testing::internal::CaptureStderr();
  EXPECT_GT(MeasureAndCacheGemmCeiling({{16, 16, 16}}, "/proc/no/such/gemm-ceiling.json", "k"),
            0.0);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("not cached"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crucible
