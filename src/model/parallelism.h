// How a model is split over ranks: the one object parallelism reaches a model through, given to
// ModelSpec::BuildTable and ModelSpec::Build (the way torchtitan's parallelize step applies a
// plan to a model written for one device). The model code says which products are column- or
// row-parallel; this says how many ranks share them and how every split dimension is cut.
//
// Tensor parallelism (Megatron style) with the same bits at every degree. Every dimension a
// tensor-parallel layer splits (query and KV heads, the FFN width, the vocabulary) is cut into
// `tp_chunks` equal chunks, a fixed number that does not depend on the degree (the largest
// degree the run may use). A rank of a group of tp_degree ranks holds tp_chunks / tp_degree
// consecutive chunks. Every product is computed chunk by chunk, with the same shapes at every
// degree, and a sum over a split dimension (a row-parallel product, the vocabulary's log-sum-exp)
// adds the chunks' partial results in one binary tree over the chunk index: chunk 2i + chunk
// 2i+1, level by level. A rank adds the subtree of its own chunks; the group exchanges the
// subtrees' roots and every rank adds the rest of the tree in the same order. So tp_degree 1, 2
// and 4 of one tp_chunks give the same bits; tp_chunks 1 is the plain model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

class Communicator;
class ComputeBackend;

// What a tensor-parallel model's collectives moved and waited, added up by TensorParallelOps
// for whoever gave the model its parallelism (the trainer reports it per step).
struct TensorParallelTraffic {
  double bytes_received = 0;  // by this rank, from the others of its group
  double seconds = 0;         // in the group's exchanges (waiting included)
  int64_t exchanges = 0;
};

struct ModelParallelism {
  int tp_degree = 1;  // ranks per tensor-parallel group
  int tp_rank = 0;    // this rank's place in it
  int tp_chunks = 1;  // chunks of every split dimension, a power of two, a multiple of tp_degree
  // The group's communicator; nullptr for one rank (tp_degree 1), or to lay out a table only.
  Communicator* tensor_parallel = nullptr;
  // Where the collectives count their traffic; nullptr: not counted.
  TensorParallelTraffic* traffic = nullptr;

  // tp_degree ranks sharing each tensor over `group` (this rank's place: its rank there).
  static ModelParallelism TensorParallel(Communicator& group, int tp_chunks);
  // A layout alone (tables and plans for a degree this process does not run), no communicator.
  static ModelParallelism Layout(int tp_degree, int tp_rank, int tp_chunks);

  int chunks_per_rank() const { return tp_chunks / tp_degree; }
  int first_chunk() const { return tp_rank * chunks_per_rank(); }
  bool distributed() const { return tp_degree > 1; }
  // "" when the degrees are consistent, else why not (the caller names its keys).
  std::string Check() const;
};

// The collectives of a tensor-parallel model over its group, with the tree above. Buffers are
// the backend's device memory; the group's exchange goes through host copies when the backend's
// memory is not the host's. Every rank of the group must make the same calls in the same order.
class TensorParallelOps {
 public:
  TensorParallelOps(const ModelParallelism& parallelism, ComputeBackend& backend);

  // partials[c], c < chunks_per_rank(), hold this rank's chunks' partial results (n floats
  // each). On return partials[0] holds the sum over every chunk of the group, the same bits on
  // every rank; the other partials are overwritten. `what` names the sum in a timeout message.
  void SumChunks(float* const* partials, size_t n, const char* what);
  // Every rank's `count` floats of `mine` (device memory), in rank order, on the host
  // (tp_degree x count floats, valid until the next call).
  const float* AllGather(const float* mine, size_t count, const char* what);
  // The same for host memory.
  const float* AllGatherHost(const float* mine, size_t count, const char* what);

 private:
  ModelParallelism parallelism_;
  ComputeBackend& backend_;
  std::vector<float> send_, gathered_;
};

}  // namespace crucible
