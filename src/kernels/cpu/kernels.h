// CPU kernels of the Llama model, fp32. Each forward sits beside its backward; shapes are in the
// comment above each pair (B batch, T time, C channels, H heads, KV key/value heads, D head dim,
// F SwiGLU hidden, V vocabulary, N = B*T rows).
//
// Determinism: every kernel gives bit-identical results for any OpenMP thread count. Work is
// split so that each output element is produced by one thread in a fixed order; reductions along
// a row (RMSNorm, softmax, log-sum-exp) take the 16-lane order of lanes.h; reductions over rows
// (weight gradients) use fixed-size chunks whose partial sums are combined in chunk order.
// Matrix products are cut into output tiles of shape-determined size, each one single-threaded
// OpenBLAS or oneDNN sgemm (see matmul.cc; which library: gemm_library.h, fixed per ISA and
// shape); tests/unit/kernels checks thread independence on every build.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/gemm_bf16.h"
#include "kernels/head_dims.h"

namespace crucible::kernels {

// Test-only switch: when set, rmsnorm_forward adds one ULP to every output (the smoke gate must
// notice). Never set in production code.
extern bool g_perturb_rmsnorm_for_tests;

// ---- matmul (a linear layer without bias, Hugging Face weight layout (OC, C)) ----
// bf16: the operands rounded to bf16 and multiplied by that native kernel (kernels/cpu/gemm_bf16.h,
// which states the arithmetic; only where Bf16GemmAvailable), or kOff: fp32 sgemm.
// inp (N,C), weight (OC,C) -> out (N,OC)
void matmul_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                    int64_t OC, Bf16Gemm bf16 = Bf16Gemm::kOff);
// dout (N,OC) -> dinp (N,C) (overwritten, or added to when accumulate_dinp) and
// dweight (OC,C) (overwritten, or added to when accumulate_dweight). dinp may be null.
void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                     bool accumulate_dweight, Bf16Gemm bf16 = Bf16Gemm::kOff);

// out (M,N) = a (M,K) b (K,N), both row-major and untransposed (Muon's B X), on the tiles and
// libraries of matmul_backward's dinp product: the same bits for any thread count.
// The same with `weight` (and `dweight`) rows `ldw` floats apart (a column block of a wider
// matrix, ldw >= C): the products read and write it in place, with the bits of the contiguous
// call on a copy (the libraries pack their operands; tests/mpi/tensor_parallel_test.cc relies
// on it across strides).
void matmul_forward_strided(float* out, const float* inp, const float* weight, int64_t ldw,
                            int64_t N, int64_t C, int64_t OC, Bf16Gemm bf16 = Bf16Gemm::kOff);
void matmul_backward_strided(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, int64_t ldw, int64_t N, int64_t C, int64_t OC,
                             bool accumulate_dinp, bool accumulate_dweight,
                             Bf16Gemm bf16 = Bf16Gemm::kOff);
void matmul_nn(float* out, const float* a, const float* b, int64_t M, int64_t K, int64_t N);
// Grouped products (a mixture of experts' experts, a grouped GEMM): group g is the rows
// [begin[g], begin[g + 1]) of inp (C wide) and out (OC wide), with its own weight weights[g]
// (OC, C). One parallel loop over the output tiles of every group, instead of one per group:
// tiles of kGroupTileRows rows from each group's first row, and columns cut from OC alone; each
// tile one single-threaded sgemm of the library gemm_library.h's table picks for
// (kGroupTileRows, OC, C). So a row's result depends neither on the other rows of its group nor
// on the thread count (what expert parallelism needs: a token's expert output must not depend on
// which tokens share its expert batch). Groups without rows are skipped.
inline constexpr int64_t kGroupTileRows = 256;
void grouped_matmul_forward(float* out, const float* inp, const float* const* weights,
                            const int64_t* begin, int64_t G, int64_t C, int64_t OC);
// dout (rows, OC) -> dinp (rows, C) on the forward's tiles (overwritten, or added to when
// accumulate_dinp) and dweights[g] (OC, C) = dout_g^T inp_g (overwritten; zeros for a group
// without rows), the weight gradients' tiles of all groups in one parallel loop too.
void grouped_matmul_backward(float* dinp, float* const* dweights, const float* dout,
                             const float* inp, const float* const* weights, const int64_t* begin,
                             int64_t G, int64_t C, int64_t OC, bool accumulate_dinp);
// inp (N,C) -> out (N,N) = inp inp^T, exactly symmetric: only the tiles on and above the diagonal
// of a fixed grid of kGramTile x kGramTile tiles (a pure function of N) are multiplied, each one
// single-threaded sgemm as in matmul_forward, and the upper triangle is mirrored into the lower,
// so the bits depend neither on the thread count nor on which library computes a tile. About
// (1 + kGramTile / N) / 2 of matmul_forward(out, inp, inp, N, C, N)'s flops (Muon's X X^T and A A).
inline constexpr int64_t kGramTile = 128;
void matmul_gram(float* out, const float* inp, int64_t N, int64_t C);

// ---- embedding ----
// tokens (N) -> out (N,C) = table[tokens]
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t N, int64_t C);
// dtable (V,C) += scatter of dout (N,C) by tokens
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                        int64_t C);
// A slice of the table, rows [first, first + rows) of the vocabulary (a vocabulary-parallel
// embedding): a token outside it gives a row of zeros, and its gradient goes nowhere. With
// first = 0 and rows = the vocabulary, the bits of the two above.
void embedding_forward_rows(float* out, const int32_t* tokens, const float* table, int64_t N,
                            int64_t C, int64_t first, int64_t rows);
void embedding_backward_rows(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                             int64_t C, int64_t first, int64_t rows);

// ---- RMSNorm ----
// inp (N,C), weight (C) -> out (N,C), rstd (N)
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps);
// dout (N,C) -> dinp (N,C) (added to), dweight (C) (overwritten)
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C);

// ---- rotary position embedding (Hugging Face rotate_half convention) ----
// cos/sin tables (T, D/2) for positions 0..T-1.
void rope_tables(float* cos_table, float* sin_table, int64_t T, int64_t D, double theta);
// x (B,T,heads,D) rotated in place by position t.
void rope_forward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                  int64_t heads, int64_t D);
// dx (B,T,heads,D) rotated back in place.
void rope_backward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D);
// A partial rotation (MLA's decoupled RoPE): the D values of head h of row bt (= b T + t) start at
// x + (bt heads + h) stride + offset, the rest of each head is left alone. stride = D, offset 0 is
// rope_forward (the same bits).
void rope_forward_strided(float* x, const float* cos_table, const float* sin_table, int64_t B,
                          int64_t T, int64_t heads, int64_t D, int64_t stride, int64_t offset);
void rope_backward_strided(float* dx, const float* cos_table, const float* sin_table, int64_t B,
                           int64_t T, int64_t heads, int64_t D, int64_t stride, int64_t offset);

// ---- rows and columns (kernels/cpu/moe.cc) ----
// dst[r * ldd + c] = (or +=, when accumulate) src[r * lds + c] for r < rows, c < cols.
void copy_columns(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                  int64_t cols, bool accumulate);
// A mixture of experts' token rows (model/moe_routing.h): each of N tokens goes to K experts;
// slot (t, k) is row rows[t K + k] of the experts' row-sorted layout (N K rows).
//   gather_rows  out[rows[t K + k]] = x[t] (out (N K, C), x (N, C))
//   moe_combine  out[t] += sum over k = 0..K-1, in that order, of weights[t K + k] y[rows[t K + k]]
//   moe_combine_backward  dy[rows[t K + k]] = weights[t K + k] dout[t] and
//                dweights[t K + k] = <dout[t], y[rows[t K + k]]> (a double sum in index order)
//   scatter_add_rows  dx[t] += sum over k = 0..K-1, in that order, of drows[rows[t K + k]]
// Each output is written by one thread in a fixed order: the bits do not depend on the thread
// count, nor on which other tokens share an expert.
void gather_rows(float* out, const float* x, const int32_t* rows, int64_t N, int64_t K, int64_t C);
void moe_combine(float* out, const float* y, const int32_t* rows, const float* weights, int64_t N,
                 int64_t K, int64_t C);
void moe_combine_backward(float* dy, float* dweights, const float* dout, const float* y,
                          const int32_t* rows, const float* weights, int64_t N, int64_t K,
                          int64_t C);
void scatter_add_rows(float* dx, const float* drows, const int32_t* rows, int64_t N, int64_t K,
                      int64_t C);

// ---- causal grouped-query attention (flash style, kernels/cpu/attention.cc) ----
// q (B,T,H,D.qk), k (B,T,KV,D.qk), v (B,T,KV,D.v) -> out (B,T,H,D.v), lse (B,H,T): the
// log-sum-exp of each query row's causal scores scaled by 1/sqrt(D.qk), all the backward pass
// keeps of the softmax (no (T,T) matrix is stored). D: one width for both, or two (MLA).
// Query head h reads kv head h / (H/KV). Scratch is a few 64x64 tiles per thread, internal.
// bf16_operands: every operand of every product (Q, K, V, dO, the probabilities, the score
// gradient) rounded to bf16, fp32 accumulation (compute/backend.h "Precision"; attention.cc).
// products = Bf16Gemm::kAmx (with bf16_operands, where cpu_has_amx_bf16()): the tiles' products
// on AMX (gemm_bf16.h's amx_tile_product) instead of the fp32 micro-kernels on rounded copies:
// the same roundings, its own sums.
// positions (B,T), host memory, or nullptr: packed documents (SFT packing). Row t of sequence b
// is at position positions[b*T + t] of its document, and a document starts where the position
// is 0 (so positions run 0, 1, 2, ... inside each): a query attends only the keys of its own
// document, from its start to itself. Each document is computed as a sequence of its own (its
// tiles start at its first row), so its rows get the bits they get alone at the start of a
// sequence, whatever shares the row. nullptr: each row is one document.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                       bool bf16_operands = false, Bf16Gemm products = Bf16Gemm::kOff,
                       const int32_t* positions = nullptr);
// dout (B,T,H,D.v), and out, lse of the forward pass -> dq (B,T,H,D.qk), dk (B,T,KV,D.qk), dv
// (B,T,KV,D.v), all overwritten. The probabilities are recomputed tile by tile from q, k and lse.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t KV, HeadDims D, bool bf16_operands = false,
                        Bf16Gemm products = Bf16Gemm::kOff, const int32_t* positions = nullptr);

// ---- SwiGLU ----
// gate, up (N,F) -> out (N,F) = silu(gate) * up
void swiglu_forward(float* out, const float* gate, const float* up, int64_t N, int64_t F);
// dout (N,F) -> dgate, dup (N,F) overwritten
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t N, int64_t F);

// ---- cross-entropy over the vocabulary ----
// logits (N,V), targets (N) with -1 = ignore -> losses (N) (0 where ignored), lse (N).
// Returns the number of valid targets. Throws DataError for a target outside [0,V).
// check_targets alone is that check (DataError naming the first bad position), for code that
// runs the loss on another backend.
void check_targets(const int32_t* targets, int64_t N, int64_t V);
int64_t cross_entropy_forward(float* losses, float* lse, const float* logits,
                              const int32_t* targets, int64_t N, int64_t V);
// In place: logits (N,V) -> dlogits = (softmax - onehot(target)) * scale * weights[row]
// (weights nullptr: every row's is 1); ignored rows zero.
void cross_entropy_backward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights = nullptr);
// The same over a slice of the vocabulary (a vocabulary chunk: columns [first, first + V) of the
// whole logits, here (N, V)), in the pieces a log-sum-exp over several slices is made of:
//   row_max      max[i] = the largest logit of row i
//   row_exp_sum  sum[i] = sum_j exp_fast(x[i,j] - max[i]), `max` the whole row's
//   target_logits out[i] = x[i, targets[i] - first] where the target is in the slice, else 0
//   cross_entropy_backward_rows  as cross_entropy_backward with the whole row's lse, the
//     target's -scale only where it is in the slice; ignored rows (target -1) are zeros.
// One slice (first = 0, V the vocabulary) gives cross_entropy_forward's bits: its lse is
// max + log(sum) in float, and the backward is cross_entropy_backward's.
void row_max(float* max, const float* x, int64_t N, int64_t V);
void row_exp_sum(float* sum, const float* x, const float* max, int64_t N, int64_t V);
void target_logits(float* out, const float* x, const int32_t* targets, int64_t N, int64_t V,
                   int64_t first);
void cross_entropy_backward_rows(float* x_to_dx, const float* lse, const int32_t* targets,
                                 int64_t N, int64_t V, int64_t first, float scale,
                                 const float* weights);

// ---- reductions ----
// Sum of squares of x[0..n) in double, fixed chunk order (thread-count independent).
double sum_of_squares(const float* x, size_t n);

}  // namespace crucible::kernels
