// The fp32 products on each GEMM library (kernels/cpu/gemm_library.h): both libraries agree with a
// double-precision reference, forward and backward (overwrite and accumulate); each gives the same
// bits for any thread count on awkward shapes; oneDNN stays on the calling thread inside the
// tiles (no thread is started even where nested parallel regions are allowed); the choice is a
// pure function of (ISA, product, shape), and a bad [debug] gemm_library value is refused.
#include "kernels/cpu/gemm_library.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

// Sets the process's rule for one test and puts "auto" back.
struct ScopedRule {
  explicit ScopedRule(const std::string& rule) { SetGemmLibraryRule(rule); }
  ~ScopedRule() { SetGemmLibraryRule("auto"); }
};

class GemmLibraryTest : public ::testing::TestWithParam<std::string> {};

// out = inp weight^T, dinp = dout weight (+ dinp0), dweight = dout^T inp (+ dweight0), in double.
struct Reference {
  std::vector<double> out, dinp, dweight;
};
Reference ReferenceProducts(const std::vector<float>& inp, const std::vector<float>& weight,
                            const std::vector<float>& dout, const std::vector<float>& dinp0,
                            const std::vector<float>& dweight0, int64_t N, int64_t C, int64_t OC) {
  Reference r{std::vector<double>(N * OC), std::vector<double>(dinp0.begin(), dinp0.end()),
              std::vector<double>(dweight0.begin(), dweight0.end())};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += double(inp[n * C + c]) * weight[o * C + c];
      r.out[n * OC + o] = acc;
      for (int64_t c = 0; c < C; ++c) {
        r.dinp[n * C + c] += double(dout[n * OC + o]) * weight[o * C + c];
        r.dweight[o * C + c] += double(dout[n * OC + o]) * inp[n * C + c];
      }
    }
  return r;
}

// |got - want| within a few fp32 roundings of a sum of `terms` products of unit normals.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, int64_t terms,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size());
  const double tolerance = 1e-6 * terms + 1e-5;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LT(worst, tolerance) << what;
}

TEST_P(GemmLibraryTest, ProductsMatchADoubleReference) {
  ScopedRule rule(GetParam());
  const int64_t N = 300, C = 70, OC = 130;  // tiles that do not divide the shape
  auto inp = Random(N * C, 1), weight = Random(OC * C, 2), dout = Random(N * OC, 3);
  auto dinp0 = Random(N * C, 4), dweight0 = Random(OC * C, 5);
  const Reference want = ReferenceProducts(inp, weight, dout, dinp0, dweight0, N, C, OC);
  std::vector<float> out(N * OC), dinp = dinp0, dweight = dweight0;
  matmul_forward(out.data(), inp.data(), weight.data(), N, C, OC);
  matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), N, C, OC,
                  true, true);
  ExpectClose(out, want.out, C, "forward");
  ExpectClose(dinp, want.dinp, OC, "dinp (accumulated)");
  ExpectClose(dweight, want.dweight, N, "dweight (accumulated)");
  // Overwriting: the old contents must not leak in.
  std::vector<float> dinp_fresh(N * C, 1e30f), dweight_fresh(OC * C, 1e30f);
  matmul_backward(dinp_fresh.data(), dweight_fresh.data(), dout.data(), inp.data(), weight.data(),
                  N, C, OC, false, false);
  const Reference zero = ReferenceProducts(inp, weight, dout, std::vector<float>(N * C),
                                           std::vector<float>(OC * C), N, C, OC);
  ExpectClose(dinp_fresh, zero.dinp, OC, "dinp");
  ExpectClose(dweight_fresh, zero.dweight, N, "dweight");
}

TEST_P(GemmLibraryTest, ProductsAreThreadIndependent) {
  ScopedRule rule(GetParam());
  // The weight gradient's inner dimension is the token count: no library may split it by thread.
  for (const auto& [N, C, OC] :
       {std::tuple<int64_t, int64_t, int64_t>{1000, 96, 200}, {517, 333, 65}, {4096, 64, 40}}) {
    auto dout = Random(N * OC, 1), inp = Random(N * C, 2), weight = Random(OC * C, 3);
    ExpectThreadIndependent([&] {
      std::vector<float> dinp(N * C), dweight(OC * C), out(N * OC);
      matmul_forward(out.data(), inp.data(), weight.data(), N, C, OC);
      matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), N, C, OC,
                      false, false);
      std::vector<float> all = out;
      all.insert(all.end(), dinp.begin(), dinp.end());
      all.insert(all.end(), dweight.begin(), dweight.end());
      return all;
    });
  }
}

int ThreadsOfThisProcess() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count;
}

// The most threads this process had at once while `run` ran (sampled every ~50 us from a thread of
// its own, which is counted too), so threads that a library starts and ends inside one call show.
template <typename Fn>
int PeakThreadsDuring(Fn run) {
  std::atomic<bool> done{false};
  std::atomic<int> peak{0};
  std::thread sampler([&] {
    do {  // at least one sample, however short `run` is
      peak = std::max(peak.load(), ThreadsOfThisProcess());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } while (!done.load());
  });
  run();
  done = true;
  sampler.join();
  return peak.load();
}

TEST_P(GemmLibraryTest, TilesRunOnTheirOwnThreadOnly) {
  ScopedRule rule(GetParam());
  struct Restore {
    int threads = omp_get_max_threads(), levels = omp_get_max_active_levels();
    ~Restore() {
      omp_set_num_threads(threads);
      omp_set_max_active_levels(levels);
    }
  } restore;
  const int64_t N = 1000, C = 96, OC = 200;
  auto inp = Random(N * C, 1), weight = Random(OC * C, 2);
  std::vector<float> out(N * OC);
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    ASSERT_EQ(testing::ThreadsOfAParallelRegion(), threads);
    // A library that opened a region of its own inside a tile would now get new threads.
    omp_set_max_active_levels(2);
    const int idle = PeakThreadsDuring([] {});  // this process's threads and the sampler
    const int busy = PeakThreadsDuring([&] {
      for (int repeat = 0; repeat < 5; ++repeat) {
        matmul_forward(out.data(), inp.data(), weight.data(), N, C, OC);
        matmul_backward(nullptr, out.data(), out.data(), inp.data(), weight.data(), N, C, OC, false,
                        false);
      }
    });
    EXPECT_EQ(busy, idle) << threads << " threads";
    // ... and the tile's own thread setting did not leak out of the region.
    EXPECT_EQ(omp_get_max_threads(), threads);
    omp_set_max_active_levels(1);
  }
}

INSTANTIATE_TEST_SUITE_P(Libraries, GemmLibraryTest, ::testing::Values("openblas", "onednn"),
                         [](const auto& info) { return info.param; });

TEST(GemmLibraryChoice, IsAPureFunctionOfIsaProductAndShape) {
  // AVX2 (the smoke gate's pinned row, and what AVX2-only CI machines run): OpenBLAS, the library
  // the golden was made with; AVX-512: oneDNN (docs/performance.md "GEMM libraries").
  for (GemmProduct product : {GemmProduct::kForward, GemmProduct::kDinp, GemmProduct::kDweight}) {
    EXPECT_EQ(ChooseGemmLibrary(GemmIsa::kAvx2, product, 4096, 512, 1376), GemmLibrary::kOpenblas);
    EXPECT_EQ(ChooseGemmLibrary(GemmIsa::kAvx512, product, 4096, 512, 1376), GemmLibrary::kOnednn);
  }
  EXPECT_EQ(GemmLibraryRule(), "auto");
  EXPECT_EQ(GemmLibraryFor(GemmProduct::kForward, 64, 64, 64),
            ChooseGemmLibrary(gemm_isa(), GemmProduct::kForward, 64, 64, 64));
  EXPECT_EQ(GemmLibrarySummary(), std::string("gemm=auto gemm_isa=") + GemmIsaName(gemm_isa()));
  {
    ScopedRule rule("onednn");
    EXPECT_EQ(GemmLibraryFor(GemmProduct::kDweight, 64, 64, 64), GemmLibrary::kOnednn);
  }
  {
    ScopedRule rule("openblas");
    EXPECT_EQ(GemmLibraryFor(GemmProduct::kDweight, 64, 64, 64), GemmLibrary::kOpenblas);
  }
}

TEST(GemmLibraryChoice, RefusesAnUnknownLibraryNamingTheKey) {
  try {
    SetGemmLibraryRule("mkl");
    FAIL() << "accepted mkl";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("debug.gemm_library"), std::string::npos) << e.what();
  }
  EXPECT_EQ(GemmLibraryRule(), "auto");
}

}  // namespace
}  // namespace crucible::kernels
