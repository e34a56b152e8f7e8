// The decode step's kernels (model/model.h InferenceModel): products and attention whose result
// for one row is a function of that row alone, so a sequence's logits are the same bits whichever
// other sequences share its decode batch, and for any thread count.
//
// Why not matmul_forward: its tiles, and which library computes them, are chosen from the whole
// shape (matmul.cc), and a library's sgemm may block or vectorise a 1-row product differently
// from an 8-row one; so the same row can come out with other bits in another batch. Here every
// output element is one lanes.h dot product in a fixed order.
//
// Both kernels run on AVX-512 where attention_tiles.h's tile_isa() selects it, else on the build's
// AVX2: the same bits either way (decode.cc; tests/unit/kernels/decode_test.cc checks both).
#pragma once

#include <cstdint>

#include "kernels/head_dims.h"
#include "kernels/row_weights.h"

namespace crucible::kernels {

// inp (N,C), weight (OC,C) -> out (N,OC): out[i][j] = lane_dot(inp[i], weight[j], C), the
// weight row widened to float32 first when it is 16-bit (exactly: then the product is
// lane_dot(inp[i], float32(weight[j]))). Weight rows are read once for all N rows (the bandwidth
// a decode step is bound by), in parallel over them.
void matmul_rows(float* out, const float* inp, RowWeights weight, int64_t N, int64_t C, int64_t OC);

// Several products of the same input in one parallel region (a layer's q, k and v; gate and up):
// each as matmul_rows computes it, bit for bit; the threads split the products' rows taken one
// after the other, so there is one fork and one join instead of one per product.
struct RowProduct {
  float* out;         // (N, OC)
  RowWeights weight;  // (OC, C)
  int64_t OC;
};
void matmul_rows(const RowProduct* products, int count, const float* inp, int64_t N, int64_t C);

// One query row per sequence against that sequence's cached keys and values: for row i, q
// (N,H,D.qk) attends causally to positions [0, lengths[i]) of keys[i] (max_len, KV, D.qk) and
// values[i] (max_len, KV, D.v), position-major; query head h reads KV head h / (H/KV) -> out
// (N,H,D.v). D.v may differ from D.qk (multi-head latent attention). Scores scaled by
// 1/sqrt(D.qk); softmax with lanes.h's maximum and sum and exp_fast; the output a sum over
// positions in position order. `keys`, `values`, `lengths`: N entries each; every length >= 1.
void decode_attention(float* out, const float* q, const float* const* keys,
                      const float* const* values, const int64_t* lengths, int64_t N, int64_t H,
                      int64_t KV, HeadDims D);

}  // namespace crucible::kernels
