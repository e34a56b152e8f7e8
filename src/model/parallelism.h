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
//
// The rows of a micro-batch (its B x T tokens, in order) are cut the same way into tp_chunks row
// chunks of consecutive rows, for the one sum over rows a tensor-parallel model adds itself: a
// norm weight's gradient, computed per row chunk and added in the same tree. Sequence parallelism
// (Megatron's) keeps only tp_chunks / tp_degree row chunks of the residual stream and the norms
// on each rank: rank r holds rows [r N / tp_degree, (r + 1) N / tp_degree), which is the
// sequence split when a micro-batch holds one sequence. The rows are gathered before a
// column-parallel product and a row-parallel product's sum is reduce-scattered to them (the
// same tree, each rank adding its own rows), so it changes no bit either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

class Communicator;
class ComputeBackend;

// What a model's tensor- or expert-parallel collectives moved and waited, added up by
// TensorParallelOps and ExpertParallelOps for whoever gave the model its parallelism (the
// trainer reports it per step).
struct ExchangeTraffic {
  double bytes_received = 0;  // by this rank, from the others of its group
  double seconds = 0;         // in the group's exchanges (waiting included)
  int64_t exchanges = 0;
  // One exchange that received `bytes` and took `exchange_seconds`.
  void Add(double bytes, double exchange_seconds) {
    bytes_received += bytes;
    seconds += exchange_seconds;
    ++exchanges;
  }
};

struct ModelParallelism {
  int tp_degree = 1;  // ranks per tensor-parallel group
  int tp_rank = 0;    // this rank's place in it
  int tp_chunks = 1;  // chunks of every split dimension, a power of two, a multiple of tp_degree
  // The residual stream and the norms split by rows over the group (needs tp_chunks > 1 and the
  // rows of a micro-batch in tp_chunks equal chunks).
  bool sequence_parallel = false;
  // The group's communicator; nullptr for one rank (tp_degree 1), or to lay out a table only.
  Communicator* tensor_parallel = nullptr;
  // Where the collectives count their traffic; nullptr: not counted.
  ExchangeTraffic* traffic = nullptr;

  // Expert parallelism: the routed experts of every MoE layer split over a group of ep_degree
  // ranks of the data-parallel group, rank ep_rank of which computes the ep_rank-th block of
  // n_routed_experts / ep_degree consecutive experts. Every rank routes its own tokens; those an
  // expert gets travel to its owner and back with an all-to-all(v) of the group.
  int ep_degree = 1;
  int ep_rank = 0;
  Communicator* expert_parallel = nullptr;  // nullptr for ep_degree 1
  ExchangeTraffic* expert_traffic = nullptr;

  // tp_degree ranks sharing each tensor over `group` (this rank's place: its rank there).
  static ModelParallelism TensorParallel(Communicator& group, int tp_chunks);
  // A layout alone (tables and plans for a degree this process does not run), no communicator.
  static ModelParallelism Layout(int tp_degree, int tp_rank, int tp_chunks);

  // The same with expert parallelism over `group` (this rank's place: its rank there).
  ModelParallelism WithExperts(Communicator& group) const;

  int chunks_per_rank() const { return tp_chunks / tp_degree; }
  // The first row of row chunk j (of tp_chunks) of N rows; j = tp_chunks gives N.
  int64_t RowChunkBegin(int64_t j, int64_t N) const { return j * N / tp_chunks; }
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
  // The same sum, of which this rank keeps only its block: the n / tp_degree floats from
  // tp_rank x n / tp_degree (a reduce-scatter), written to `out`. The same bits as SumChunks'.
  void SumChunksScatter(float* const* partials, size_t n, float* out, const char* what);
  // SumChunksScatter's exchange alone: `root` holds this rank's subtree sum (n floats).
  void ScatterSum(const float* root, size_t n, float* out, const char* what);
  // The local tree over `count` partial results alone (no exchange), into partials[0].
  void TreeSum(float* const* partials, int count, size_t n);
  // Every rank's `count` floats of `mine` (device memory), in rank order, on the host
  // (tp_degree x count floats, valid until the next call).
  const float* AllGather(const float* mine, size_t count, const char* what);
  // The same for host memory.
  const float* AllGatherHost(const float* mine, size_t count, const char* what);
  // Every rank's `count` floats of `mine`, in rank order, into `out` (device memory,
  // tp_degree x count floats).
  void AllGatherTo(const float* mine, size_t count, float* out, const char* what);
  // All-to-all of device memory: `send` holds tp_degree blocks of `block` floats, block q for
  // rank q; returns on the host what each rank sent this one, in rank order (valid until the
  // next call).
  const float* AllToAll(const float* send, size_t block, const char* what);

 private:
  ModelParallelism parallelism_;
  ComputeBackend& backend_;
  // Counts what one exchange received and how long it took.
  void Count(double floats_received, double seconds);
  std::vector<float> send_, gathered_;
};

}  // namespace crucible
