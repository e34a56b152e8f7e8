// The portable exact mode on the GPU ([debug] portable_exact with device "cuda"): every kernel of
// the CUDA portable backend gives the CPU portable backend's bits, element for element, on random
// inputs whose shapes are multiples of nothing (and attention past one 64-key tile), with and
// without accumulation. The whole run's equality is `crucible smoke --portable --device cuda`
// against tests/golden/smoke-portable.json (scripts/gpu-check.sh).
#include <gtest/gtest.h>

#include <functional>

#include "common/error.h"
#include "gpu_test_support.h"

namespace crucible::gpu_test {
namespace {

std::shared_ptr<ComputeBackend> Portable(const std::string& device) {
  BackendOptions options;
  options.device = device;
  options.portable_exact = true;
  return MakeBackend(options);
}

// A kernel call on one backend: `arrays` are its float arrays in that backend's memory (inputs
// and outputs alike), `tokens` its int32 array.
using Kernel =
    std::function<void(ComputeBackend&, const std::vector<float*>& arrays, const int32_t* tokens)>;

class GpuPortable : public ::testing::Test {
 protected:
  // Uploads copies of `arrays` and `tokens` to `backend`, runs `kernel`, returns every array.
  static std::vector<std::vector<float>> Run(ComputeBackend& backend,
                                             const std::vector<std::vector<float>>& arrays,
                                             const std::vector<int32_t>& tokens,
                                             const Kernel& kernel) {
    std::vector<DeviceArray<float>> device;
    std::vector<float*> pointers;
    for (const auto& array : arrays) {
      device.push_back(Upload(backend, array));
      pointers.push_back(device.back().data());
    }
    auto device_tokens = Upload(backend, tokens);
    kernel(backend, pointers, device_tokens.data());
    backend.Synchronize();
    std::vector<std::vector<float>> result;
    for (const auto& array : device) result.push_back(Download(array));
    return result;
  }

  void ExpectCpuBits(const std::string& what, const std::vector<std::vector<float>>& arrays,
                     const std::vector<int32_t>& tokens, const Kernel& kernel) {
    auto want = Run(*cpu_, arrays, tokens, kernel);
    auto got = Run(*gpu_, arrays, tokens, kernel);
    for (size_t i = 0; i < arrays.size(); ++i)
      ExpectBitIdentical(what + ", array " + std::to_string(i), got[i], want[i]);
  }

  std::shared_ptr<ComputeBackend> cpu_ = Portable("cpu");
  std::shared_ptr<ComputeBackend> gpu_ = Portable("cuda");
};

TEST_F(GpuPortable, TheBackendSaysItIsPortableAndRefusesBfloat16) {
  EXPECT_NE(gpu_->Summary().find("device=cuda"), std::string::npos) << gpu_->Summary();
  EXPECT_NE(gpu_->Summary().find("portable_exact=true"), std::string::npos) << gpu_->Summary();
  BackendOptions options;
  options.device = "cuda";
  options.portable_exact = true;
  options.compute = ComputePrecision::kBfloat16;
  try {
    MakeBackend(options);
    ADD_FAILURE() << "portable_exact with bfloat16 on cuda was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("portable_exact computes in float32 only"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(GpuPortable, MatmulHasTheCpuBits) {
  const int64_t N = 37, C = 72, OC = 40;
  for (bool accumulate : {false, true}) {
    const std::string tag = accumulate ? "matmul (accumulated)" : "matmul";
    ExpectCpuBits(tag,
                  {Random(N * C, 1), Random(OC * C, 2, 0.1f), Random(N * OC, 3), Random(N * OC, 4),
                   Random(N * C, 5), Random(OC * C, 6)},
                  {}, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t*) {
                    be.MatmulForward(a[3], a[0], a[1], N, C, OC);
                    be.MatmulBackward(a[4], a[5], a[2], a[0], a[1], N, C, OC, accumulate,
                                      accumulate);
                  });
  }
  ExpectCpuBits("matmul without dinp", {Random(N * C, 7), Random(N * OC, 8), Random(OC * C, 9)}, {},
                [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t*) {
                  be.MatmulBackward(nullptr, a[2], a[1], a[0], nullptr, N, C, OC, false, true);
                });
}

TEST_F(GpuPortable, EmbeddingHasTheCpuBits) {
  const int64_t V = 50, N = 301, C = 72;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 5) % V);
  tokens[3] = tokens[10] = tokens[200] = 0;
  ExpectCpuBits("embedding",
                {Random(V * C, 10), Random(N * C, 11), Random(N * C, 12), Random(V * C, 13)},
                tokens, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t* t) {
                  be.EmbeddingForward(a[1], t, a[0], N, C);
                  be.EmbeddingBackward(a[3], a[2], t, N, C);
                });
}

TEST_F(GpuPortable, RmsnormHasTheCpuBits) {
  const int64_t N = 37, C = 72;
  ExpectCpuBits("rmsnorm",
                {Random(N * C, 14), Random(C, 15), Random(N * C, 16), Random(N, 17),
                 Random(N * C, 18), Random(N * C, 19), Random(C, 20)},
                {}, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t*) {
                  be.RmsnormForward(a[2], a[3], a[0], a[1], N, C, 1e-5f);
                  be.RmsnormBackward(a[5], a[6], a[4], a[0], a[1], a[3], N, C);
                });
}

TEST_F(GpuPortable, RopeHasTheCpuBits) {
  const int64_t B = 2, T = 37, heads = 3, D = 16;
  ExpectCpuBits("rope",
                {Random(T * D / 2, 21), Random(T * D / 2, 22), Random(B * T * heads * D, 23),
                 Random(B * T * heads * D, 24)},
                {}, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t*) {
                  be.RopeForward(a[2], a[0], a[1], B, T, heads, D);
                  be.RopeBackward(a[3], a[0], a[1], B, T, heads, D);
                });
}

// The forward's out and lse feed the backward, as in training (random lse could overflow exp).
TEST_F(GpuPortable, AttentionHasTheCpuBits) {
  for (int64_t T : {37, 70}) {
    const int64_t B = 2, H = 4, KV = 2, D = 16;
    const int64_t q_size = B * T * H * D, kv_size = B * T * KV * D;
    ExpectCpuBits("attention T=" + std::to_string(T),
                  {Random(q_size, 25), Random(kv_size, 26), Random(kv_size, 27), Random(q_size, 28),
                   Random(B * H * T, 29), Random(q_size, 30), Random(q_size, 31),
                   Random(kv_size, 32), Random(kv_size, 33)},
                  {}, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t*) {
                    be.AttentionForward(a[3], a[4], a[0], a[1], a[2], B, T, H, KV, D, nullptr);
                    be.AttentionBackward(a[6], a[7], a[8], a[5], a[3], a[4], a[0], a[1], a[2], B, T,
                                         H, KV, D, nullptr);
                  });
  }
}

TEST_F(GpuPortable, SwigluHasTheCpuBits) {
  const int64_t N = 37, F = 301;
  ExpectCpuBits("swiglu",
                {Random(N * F, 34, 6.0f), Random(N * F, 35), Random(N * F, 36), Random(N * F, 37),
                 Random(N * F, 38), Random(N * F, 39)},
                {}, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t*) {
                  be.SwigluForward(a[2], a[0], a[1], N, F);
                  be.SwigluBackward(a[4], a[5], a[3], a[0], a[1], N, F);
                });
}

TEST_F(GpuPortable, CrossEntropyHasTheCpuBits) {
  const int64_t N = 37, V = 301;
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 13) % V);
  targets[5] = targets[20] = -1;  // ignored
  for (bool weighted : {false, true})
    ExpectCpuBits(weighted ? "cross-entropy (weighted)" : "cross-entropy",
                  {Random(N * V, 40, 8.0f), Random(N, 41), Random(N, 42), Random(N, 43, 2.0f)},
                  targets, [=](ComputeBackend& be, const std::vector<float*>& a, const int32_t* t) {
                    be.CrossEntropyForward(a[1], a[2], a[0], t, N, V);
                    be.CrossEntropyBackward(a[0], a[2], t, N, V, 1.0f / N,
                                            weighted ? a[3] : nullptr);
                  });
}

}  // namespace
}  // namespace crucible::gpu_test
