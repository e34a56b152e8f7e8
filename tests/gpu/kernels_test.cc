// Every CUDA kernel against the CPU backend on random inputs (fp32 within the stated tolerance;
// bf16 matmul against the CPU in fp32 on operands rounded to bf16, bf16 attention against the
// CPU's bf16 attention), and each run twice on the GPU for the same bits. Shapes are not
// multiples of the kernels' tiles (64 and 32 keys, 64 rows, 256 threads).
#include "kernels/cpu/kernels.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "gpu_test_support.h"

namespace crucible::gpu_test {
namespace {

constexpr auto kF32 = ComputePrecision::kFloat32;
constexpr auto kBf16 = ComputePrecision::kBfloat16;

class GpuKernels : public ::testing::Test {
 protected:
  std::shared_ptr<ComputeBackend> cpu_ = DefaultCpuBackend();
  std::shared_ptr<ComputeBackend> cpu_bf16_ = [] {
    BackendOptions options;
    options.compute = ComputePrecision::kBfloat16;
    options.bf16_path = "emulated";
    return MakeBackend(options);
  }();
  std::shared_ptr<ComputeBackend> gpu_ = Cuda(kF32);
  std::shared_ptr<ComputeBackend> gpu_bf16_ = Cuda(kBf16);
};

TEST_F(GpuKernels, FillAndAddAreExact) {
  const size_t n = 1000003;
  auto x = Random(n, 1), y = Random(n, 2);
  auto dy = Upload(*gpu_, y), dx = Upload(*gpu_, x);
  gpu_->Add(dy.data(), dx.data(), n);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = y[i] + x[i];
  ExpectClose("Add", Download(dy), want, 0, 0);
  gpu_->Fill(dy.data(), n, 0.25f);
  ExpectClose("Fill", Download(dy), std::vector<float>(n, 0.25f), 0, 0);
}

// inp (N,C), weight (OC,C); both precisions; backward with and without accumulation.
void CheckMatmul(ComputeBackend& gpu, ComputeBackend& cpu, bool bf16, int64_t N, int64_t C,
                 int64_t OC) {
  const std::string tag = std::string(bf16 ? "bf16" : "fp32") + " matmul N=" + std::to_string(N) +
                          " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
  auto inp = Random(N * C, 3), weight = Random(OC * C, 4, 0.1f), dout = Random(N * OC, 5);
  auto dinp0 = Random(N * C, 6), dweight0 = Random(OC * C, 7);
  // The oracle: fp32 on the operands the GPU multiplies (bf16-rounded when bf16).
  auto ri = bf16 ? RoundedToBfloat16(inp) : inp, rw = bf16 ? RoundedToBfloat16(weight) : weight,
       rd = bf16 ? RoundedToBfloat16(dout) : dout;
  std::vector<float> out(N * OC), dinp = dinp0, dweight = dweight0;
  cpu.MatmulForward(out.data(), ri.data(), rw.data(), N, C, OC);
  cpu.MatmulBackward(dinp.data(), dweight.data(), rd.data(), ri.data(), rw.data(), N, C, OC, true,
                     true);
  auto run = [&](bool accumulate) {
    auto g_inp = Upload(gpu, inp), g_w = Upload(gpu, weight), g_dout = Upload(gpu, dout);
    auto g_out = Upload(gpu, std::vector<float>(N * OC, 7.0f));  // overwritten
    auto g_dinp = Upload(gpu, dinp0), g_dw = Upload(gpu, dweight0);
    gpu.MatmulForward(g_out.data(), g_inp.data(), g_w.data(), N, C, OC);
    gpu.MatmulBackward(g_dinp.data(), g_dw.data(), g_dout.data(), g_inp.data(), g_w.data(), N, C,
                       OC, accumulate, accumulate);
    return std::vector<std::vector<float>>{Download(g_out), Download(g_dinp), Download(g_dw)};
  };
  auto first = run(true), second = run(true);
  const double atol = 1e-4, rtol = 1e-4;  // fp32 accumulation over <= 300 terms, another order
  ExpectClose(tag + " forward", first[0], out, atol, rtol);
  ExpectClose(tag + " dinp (accumulated)", first[1], dinp, atol, rtol);
  ExpectClose(tag + " dweight (accumulated)", first[2], dweight, atol, rtol);
  for (int i = 0; i < 3; ++i)
    ExpectSameBits(tag + " output " + std::to_string(i), first[i], second[i]);
  // Overwriting: the same products without the initial values.
  auto overwritten = run(false);
  std::vector<float> dinp_only(N * C), dweight_only(OC * C);
  cpu.MatmulBackward(dinp_only.data(), dweight_only.data(), rd.data(), ri.data(), rw.data(), N, C,
                     OC, false, false);
  ExpectClose(tag + " dinp (overwritten)", overwritten[1], dinp_only, atol, rtol);
  ExpectClose(tag + " dweight (overwritten)", overwritten[2], dweight_only, atol, rtol);
}

TEST_F(GpuKernels, MatmulMatchesTheCpuInFp32AndBf16) {
  for (auto [N, C, OC] :
       {std::tuple<int64_t, int64_t, int64_t>{37, 72, 40}, {128, 64, 256}, {65, 300, 17}}) {
    CheckMatmul(*gpu_, *cpu_, false, N, C, OC);
    CheckMatmul(*gpu_bf16_, *cpu_, true, N, C, OC);
  }
}

TEST_F(GpuKernels, EmbeddingMatchesTheCpuBitForBit) {
  const int64_t V = 50, N = 301, C = 72;
  auto table = Random(V * C, 8);
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 5) % V);
  tokens[3] = tokens[10] = tokens[200] = 0;  // one token many times
  auto dout = Random(N * C, 9), dtable0 = Random(V * C, 10);
  std::vector<float> out(N * C), dtable = dtable0;
  cpu_->EmbeddingForward(out.data(), tokens.data(), table.data(), N, C);
  cpu_->EmbeddingBackward(dtable.data(), dout.data(), tokens.data(), N, C);
  auto run = [&] {
    auto g_table = Upload(*gpu_, table), g_dout = Upload(*gpu_, dout),
         g_dt = Upload(*gpu_, dtable0);
    auto g_tokens = Upload(*gpu_, tokens);
    DeviceArray<float> g_out(*gpu_, N * C);
    gpu_->EmbeddingForward(g_out.data(), g_tokens.data(), g_table.data(), N, C);
    gpu_->EmbeddingBackward(g_dt.data(), g_dout.data(), g_tokens.data(), N, C);
    return std::pair{Download(g_out), Download(g_dt)};
  };
  auto [g_out, g_dtable] = run();
  auto [g_out2, g_dtable2] = run();
  // The same additions in position order as the CPU: the same bits.
  ExpectClose("embedding forward", g_out, out, 0, 0);
  ExpectClose("embedding backward", g_dtable, dtable, 0, 0);
  ExpectSameBits("embedding backward", g_dtable, g_dtable2);
}

TEST_F(GpuKernels, RmsnormMatchesTheCpu) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 72}, {130, 520}}) {
    const std::string tag = "rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C);
    auto inp = Random(N * C, 11), weight = Random(C, 12), dout = Random(N * C, 13);
    auto dinp0 = Random(N * C, 14);
    std::vector<float> out(N * C), rstd(N), dinp = dinp0, dweight(C);
    cpu_->RmsnormForward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-5f);
    cpu_->RmsnormBackward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                          rstd.data(), N, C);
    auto run = [&] {
      auto g_inp = Upload(*gpu_, inp), g_w = Upload(*gpu_, weight), g_dout = Upload(*gpu_, dout);
      auto g_dinp = Upload(*gpu_, dinp0);
      DeviceArray<float> g_out(*gpu_, N * C), g_rstd(*gpu_, N), g_dw(*gpu_, C);
      gpu_->Fill(g_dw.data(), C, 9.0f);  // overwritten
      gpu_->RmsnormForward(g_out.data(), g_rstd.data(), g_inp.data(), g_w.data(), N, C, 1e-5f);
      gpu_->RmsnormBackward(g_dinp.data(), g_dw.data(), g_dout.data(), g_inp.data(), g_w.data(),
                            g_rstd.data(), N, C);
      return std::vector<std::vector<float>>{Download(g_out), Download(g_rstd), Download(g_dinp),
                                             Download(g_dw)};
    };
    auto first = run(), second = run();
    ExpectClose(tag + " out", first[0], out, 1e-5, 1e-5);
    ExpectClose(tag + " rstd", first[1], rstd, 0, 1e-5);
    ExpectClose(tag + " dinp", first[2], dinp, 1e-5, 1e-4);
    ExpectClose(tag + " dweight", first[3], dweight, 1e-4, 1e-4);
    for (int i = 0; i < 4; ++i)
      ExpectSameBits(tag + " output " + std::to_string(i), first[i], second[i]);
  }
}

TEST_F(GpuKernels, RopeMatchesTheCpuAndItsBackwardInvertsIt) {
  const int64_t B = 2, T = 37, heads = 3, D = 16;
  std::vector<float> cos_table(T * D / 2), sin_table(T * D / 2);
  kernels::rope_tables(cos_table.data(), sin_table.data(), T, D, 10000.0);
  auto x = Random(B * T * heads * D, 15);
  std::vector<float> forward = x;
  cpu_->RopeForward(forward.data(), cos_table.data(), sin_table.data(), B, T, heads, D);
  std::vector<float> backward = x;
  cpu_->RopeBackward(backward.data(), cos_table.data(), sin_table.data(), B, T, heads, D);
  auto g_cos = Upload(*gpu_, cos_table), g_sin = Upload(*gpu_, sin_table);
  auto g_x = Upload(*gpu_, x), g_dx = Upload(*gpu_, x);
  gpu_->RopeForward(g_x.data(), g_cos.data(), g_sin.data(), B, T, heads, D);
  gpu_->RopeBackward(g_dx.data(), g_cos.data(), g_sin.data(), B, T, heads, D);
  ExpectClose("rope forward", Download(g_x), forward, 1e-6, 1e-6);
  ExpectClose("rope backward", Download(g_dx), backward, 1e-6, 1e-6);
}

TEST_F(GpuKernels, SwigluMatchesTheCpu) {
  const int64_t N = 37, F = 301;
  auto gate = Random(N * F, 16, 6.0f), up = Random(N * F, 17), dout = Random(N * F, 18);
  std::vector<float> out(N * F), dgate(N * F), dup(N * F);
  cpu_->SwigluForward(out.data(), gate.data(), up.data(), N, F);
  cpu_->SwigluBackward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N, F);
  auto g_gate = Upload(*gpu_, gate), g_up = Upload(*gpu_, up), g_dout = Upload(*gpu_, dout);
  DeviceArray<float> g_out(*gpu_, N * F), g_dgate(*gpu_, N * F), g_dup(*gpu_, N * F);
  gpu_->SwigluForward(g_out.data(), g_gate.data(), g_up.data(), N, F);
  gpu_->SwigluBackward(g_dgate.data(), g_dup.data(), g_dout.data(), g_gate.data(), g_up.data(), N,
                       F);
  // The CPU's sigmoid is a vectorised exp approximation: a few ulp from expf.
  ExpectClose("swiglu forward", Download(g_out), out, 1e-6, 1e-5);
  ExpectClose("swiglu dgate", Download(g_dgate), dgate, 1e-6, 1e-5);
  ExpectClose("swiglu dup", Download(g_dup), dup, 1e-6, 1e-5);
}

TEST_F(GpuKernels, CrossEntropyMatchesTheCpu) {
  const int64_t N = 37, V = 1000;
  auto logits = Random(N * V, 19, 8.0f), weights = Random(N, 20);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = i % 6 == 5 ? -1 : static_cast<int32_t>((i * 97) % V);
  std::vector<float> losses(N), lse(N), dlogits = logits;
  cpu_->CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  cpu_->CrossEntropyBackward(dlogits.data(), lse.data(), targets.data(), N, V, 0.01f,
                             weights.data());
  auto run = [&] {
    auto g_logits = Upload(*gpu_, logits), g_weights = Upload(*gpu_, weights);
    auto g_targets = Upload(*gpu_, targets);
    DeviceArray<float> g_losses(*gpu_, N), g_lse(*gpu_, N);
    gpu_->CrossEntropyForward(g_losses.data(), g_lse.data(), g_logits.data(), g_targets.data(), N,
                              V);
    auto l = Download(g_losses), s = Download(g_lse);
    gpu_->CrossEntropyBackward(g_logits.data(), g_lse.data(), g_targets.data(), N, V, 0.01f,
                               g_weights.data());
    return std::vector<std::vector<float>>{l, s, Download(g_logits)};
  };
  auto first = run(), second = run();
  ExpectClose("cross-entropy losses", first[0], losses, 1e-5, 1e-5);
  ExpectClose("cross-entropy lse", first[1], lse, 1e-5, 1e-6);
  ExpectClose("cross-entropy dlogits", first[2], dlogits, 1e-8, 1e-4);
  for (int i = 0; i < 3; ++i)
    ExpectSameBits("cross-entropy output " + std::to_string(i), first[i], second[i]);
}

// bf16 attention against the CPU's bf16 attention: both round the same operands at the same
// places (q, k, v, dO; P~ per 64-key tile under the running max; P and dS in the backward), so
// what is left is fp32 rounding (sum orders, expf against exp_fast) and, where that moves a value
// across a bf16 rounding boundary, one bf16 ulp (2^-8) of that one probability or score
// gradient. Stated tolerance: every element within 4e-3 + 4e-3 |want| (a few such flips, each
// at most 2^-8 of one term; the test compared the GPU with the CPU in fp32 within 2e-2 before
// the roundings agreed), and at least 90% of them within 1e-5 + 1e-4 |want| (fp32 alone).
void ExpectBf16Agreement(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want) {
  ExpectClose(what, got, want, 4e-3, 4e-3);
  size_t apart = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= 1e-5 + 1e-4 * std::fabs(want[i])))
      ++apart;
  EXPECT_LE(apart, got.size() / 10) << what << ": " << apart << " of " << got.size()
                                    << " elements differ from the CPU's bf16 by more than fp32 "
                                       "rounding (1e-5 + 1e-4 |want|)";
}

// q (B,T,H,D), k, v (B,T,KV,D). fp32: the CPU's fp32 attention. bf16: the CPU's bf16 attention
// (`cpu` a bf16 CPU backend) on the same unrounded inputs, compared by ExpectBf16Agreement.
void CheckAttention(ComputeBackend& gpu, ComputeBackend& cpu, bool bf16, int64_t B, int64_t T,
                    int64_t H, int64_t KV, int64_t D) {
  const std::string tag = std::string(bf16 ? "bf16" : "fp32") +
                          " attention T=" + std::to_string(T) + " H=" + std::to_string(H) +
                          " KV=" + std::to_string(KV) + " D=" + std::to_string(D);
  auto q = Random(B * T * H * D, 21), k = Random(B * T * KV * D, 22),
       v = Random(B * T * KV * D, 23);
  auto dout = Random(B * T * H * D, 24);
  ASSERT_EQ(cpu.compute() == ComputePrecision::kBfloat16, bf16) << tag;
  std::vector<float> out(B * T * H * D), lse(B * H * T), dq(q.size()), dk(k.size()), dv(v.size());
  cpu.AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D,
                       nullptr);
  cpu.AttentionBackward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                        q.data(), k.data(), v.data(), B, T, H, KV, D, nullptr);
  auto run = [&] {
    auto g_q = Upload(gpu, q), g_k = Upload(gpu, k), g_v = Upload(gpu, v), g_do = Upload(gpu, dout);
    DeviceArray<float> g_out(gpu, out.size()), g_lse(gpu, lse.size()), g_dq(gpu, q.size()),
        g_dk(gpu, k.size()), g_dv(gpu, v.size());
    gpu.AttentionForward(g_out.data(), g_lse.data(), g_q.data(), g_k.data(), g_v.data(), B, T, H,
                         KV, D, nullptr);
    gpu.AttentionBackward(g_dq.data(), g_dk.data(), g_dv.data(), g_do.data(), g_out.data(),
                          g_lse.data(), g_q.data(), g_k.data(), g_v.data(), B, T, H, KV, D,
                          nullptr);
    return std::vector<std::vector<float>>{Download(g_out), Download(g_lse), Download(g_dq),
                                           Download(g_dk), Download(g_dv)};
  };
  auto first = run(), second = run();
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  const std::vector<float>* want[] = {&out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 5; ++i) {
    if (bf16)
      ExpectBf16Agreement(tag + " " + names[i], first[i], *want[i]);
    else if (i == 1)
      ExpectClose(tag + " lse", first[1], lse, 1e-5, 1e-5);  // lse is not rounded in bf16
    else
      ExpectClose(tag + " " + names[i], first[i], *want[i], 2e-5, 1e-4);
  }
  for (int i = 0; i < 5; ++i) ExpectSameBits(tag + " " + names[i], first[i], second[i]);
}

TEST_F(GpuKernels, AttentionMatchesTheCpuInFp32AndBf16) {
  for (auto [T, H, KV, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{70, 4, 2, 16},
                             {33, 2, 2, 64},
                             {100, 6, 1, 128},
                             {5, 4, 4, 8},
                             {200, 4, 2, 32}}) {  // 4 key tiles: the running max moves
    CheckAttention(*gpu_, *cpu_, false, 2, T, H, KV, D);
    CheckAttention(*gpu_bf16_, *cpu_bf16_, true, 2, T, H, KV, D);
  }
}

TEST_F(GpuKernels, AnAllocationTooLargeNamesTheBytesAndWhatIsFree) {
  try {
    gpu_->Allocate(size_t{1} << 50);
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitFailure);
    EXPECT_NE(std::string(e.what()).find("cannot allocate 1125899906842624 bytes"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("free of"), std::string::npos) << e.what();
  }
  // The backend still works after the failure.
  auto x = Upload(*gpu_, std::vector<float>{1, 2, 3});
  EXPECT_EQ(Download(x)[2], 3.0f);
}

TEST_F(GpuKernels, ALocalRankBeyondTheGpusIsAUsageError) {
  BackendOptions options;
  options.device = "cuda";
  options.local_rank = 999;
  try {
    MakeBackend(options);
    FAIL() << "LOCAL_RANK 999 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("LOCAL_RANK 999"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace crucible::gpu_test
