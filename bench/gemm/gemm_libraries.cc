// One fp32 GEMM library on the products of a Llama training step, for bench/gemm_libraries.py
// (which builds nothing: CMake builds this file once per library found, as gemm_openblas,
// gemm_blis and gemm_dnnl, each linking only its own library so no two export cblas_sgemm into
// one process; and as gemm_crucible, Crucible's own tiled kernels::matmul_forward and
// matmul_backward, whose backward computes dinp and dweight in one call, on the libraries the
// trainer's `auto` picks (kernels/cpu/gemm_library.h), so its column is what the trainer runs).
//
//   gemm_<library> N C OC [repeats]
//
// Times the three products of a linear layer (inp (N,C), weight (OC,C)) on all OpenMP threads:
//   forward    out (N,OC)    = inp @ weight^T
//   dinp       dinp (N,C)    = dout @ weight
//   dweight    dweight (OC,C) = dout^T @ inp
// and prints one JSON line per product: the best GFLOP/s over the repeats, and whether the result
// is bit-identical with one thread and with all of them (a library whose bits depend on the
// thread count cannot serve Crucible's determinism as it is).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(GEMM_DNNL)
#include <oneapi/dnnl/dnnl.h>
#define LIBRARY "onednn"
#elif defined(GEMM_CRUCIBLE)
#include <cblas.h>

#include "kernels/cpu/kernels.h"
#define LIBRARY "crucible"
#else
#include <cblas.h>
#if defined(GEMM_BLIS)
#include <blis.h>
#define LIBRARY "blis"
#else
#define LIBRARY "openblas"
#endif
#endif

namespace {

// Row-major C (M,N) = op(A) op(B), op = transpose where the flag says.
void Gemm(bool ta, bool tb, long M, long N, long K, const float* A, long lda, const float* B,
          long ldb, float* C, long ldc) {
#if defined(GEMM_DNNL)
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
#else
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
#endif
}

void SetThreads(int threads) {
  omp_set_num_threads(threads);
#if defined(GEMM_BLIS)
  bli_thread_set_num_threads(threads);
#elif !defined(GEMM_DNNL) && !defined(GEMM_CRUCIBLE)
  openblas_set_num_threads(threads);
#endif
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s N C OC [repeats]\n", argv[0]);
    return 2;
  }
  const long N = std::atol(argv[1]), C = std::atol(argv[2]), OC = std::atol(argv[3]);
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 5;
  const int threads = omp_get_max_threads();
  std::vector<float> inp(N * C), weight(OC * C), dout(N * OC);
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = static_cast<float>((i * 7) % 13) * 0.01f - 0.06f;
  for (size_t i = 0; i < weight.size(); ++i)
    weight[i] = static_cast<float>((i * 5) % 11) * 0.01f - 0.05f;
  for (size_t i = 0; i < dout.size(); ++i)
    dout[i] = static_cast<float>((i * 3) % 7) * 0.01f - 0.03f;
  struct Product {
    const char* name;
    bool ta, tb;
    long M, Nn, K;
    const float *A, *B;
    long lda, ldb, ldc;
  };
  const Product products[] = {
      {"forward", false, true, N, OC, C, inp.data(), weight.data(), C, C, OC},
      {"dinp", false, false, N, C, OC, dout.data(), weight.data(), OC, C, C},
      {"dweight", true, false, OC, C, N, dout.data(), inp.data(), OC, C, C},
  };
#if defined(GEMM_CRUCIBLE)
  // forward = matmul_forward; backward = matmul_backward (dinp and dweight, 4 N C OC flops).
  std::vector<float> out(N * OC), dinp(N * C), dweight(OC * C);
  for (int pass = 0; pass < 2; ++pass) {
    const bool forward = pass == 0;
    auto run = [&] {
      if (forward)
        crucible::kernels::matmul_forward(out.data(), inp.data(), weight.data(), N, C, OC);
      else
        crucible::kernels::matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(),
                                           weight.data(), N, C, OC, false, false);
    };
    SetThreads(1);
    run();
    const std::vector<float> one = forward ? out : dweight;
    SetThreads(threads);
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
      const double start = Seconds();
      run();
      best = std::max(best, (forward ? 2.0 : 4.0) * N * C * OC / (Seconds() - start) / 1e9);
    }
    const std::vector<float>& all = forward ? out : dweight;
    const bool same = std::memcmp(one.data(), all.data(), one.size() * sizeof(float)) == 0;
    std::printf(
        "{\"library\": \"%s\", \"product\": \"%s\", \"N\": %ld, \"C\": %ld, \"OC\": %ld, "
        "\"threads\": %d, \"gflops\": %.2f, \"thread_independent\": %s}\n",
        LIBRARY, forward ? "forward" : "backward", N, C, OC, threads, best,
        same ? "true" : "false");
  }
  return 0;
#endif
  for (const Product& p : products) {
    std::vector<float> one(p.M * p.ldc), all(p.M * p.ldc);
    SetThreads(1);
    Gemm(p.ta, p.tb, p.M, p.Nn, p.K, p.A, p.lda, p.B, p.ldb, one.data(), p.ldc);
    SetThreads(threads);
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
      const double start = Seconds();
      Gemm(p.ta, p.tb, p.M, p.Nn, p.K, p.A, p.lda, p.B, p.ldb, all.data(), p.ldc);
      best = std::max(best, 2.0 * p.M * p.Nn * p.K / (Seconds() - start) / 1e9);
    }
    const bool same = std::memcmp(one.data(), all.data(), one.size() * sizeof(float)) == 0;
    std::printf(
        "{\"library\": \"%s\", \"product\": \"%s\", \"N\": %ld, \"C\": %ld, \"OC\": %ld, "
        "\"threads\": %d, \"gflops\": %.2f, \"thread_independent\": %s}\n",
        LIBRARY, p.name, N, C, OC, threads, best, same ? "true" : "false");
  }
  return 0;
}
