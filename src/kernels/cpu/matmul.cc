// Linear layers through OpenBLAS sgemm (row-major, Hugging Face weight layout (OC, C)).
#include <cblas.h>

#include "kernels/cpu/kernels.h"

namespace crucible::kernels {

void matmul_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                    int64_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
              out, OC);
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                     bool accumulate_dweight) {
  if (dinp) {
    // dinp (N,C) = dout (N,OC) @ weight (OC,C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                accumulate_dinp ? 1.0f : 0.0f, dinp, C);
  }
  // dweight (OC,C) = dout^T (OC,N) @ inp (N,C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
              accumulate_dweight ? 1.0f : 0.0f, dweight, C);
}

}  // namespace crucible::kernels
