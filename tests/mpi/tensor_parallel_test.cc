// A tensor-parallel Llama against the same model on one process: the same bits. Every rank
// builds the whole model (its split dimensions cut into 4 chunks, model/parallelism.h) and runs
// it alone, then runs its part of the model over the mesh's tensor_parallel group. The losses,
// each position's loss and prediction, and every gradient of its part must equal the whole
// model's bit for bit, at tensor-parallel degree 1 (a mesh without the dimension: a group of
// one), 2 and 4 (test_collectives.py runs the meshes), with sequence parallelism and without.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/philox.h"
#include "distributed/mesh.h"
#include "model/model.h"

namespace crucible {

extern ProcessMesh* g_mesh;  // collectives_test.cc

namespace {

constexpr int kChunks = 4;
constexpr int64_t B = 2, T = 16;
constexpr float kLossScale = 0.0625f;

Communicator& TensorGroup() {
  static std::unique_ptr<Communicator> one = Communicator::OneRank();
  for (const MeshDimension& d : g_mesh->layout().dimensions())
    if (d.name == "tensor_parallel") return g_mesh->group(d.name);
  return *one;
}

struct Pass {
  LossSum fused, scored;
  std::vector<float> losses, scored_losses, grads;
  std::vector<int32_t> predictions;
};

Pass Run(const ModelSpec& spec, const ModelParallelism& parallelism, const std::vector<float>& w,
         bool weighted) {
  const std::unique_ptr<Model> model = spec.Build(B, T, DefaultCpuBackend(), parallelism);
  Philox rng(11, 0);
  const int64_t V = spec.vocab_size();
  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::vector<float> loss_weights(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(rng.NextU32() % V);
    targets[i] = i % 7 == 6 ? -1 : static_cast<int32_t>(rng.NextU32() % V);
    loss_weights[i] = 0.5f + 0.25f * static_cast<float>(i % 3);
  }
  Pass pass;
  pass.grads.assign(model->table().total(), 0.0f);
  FlatParameterAccess access(model->table(), w.data(), pass.grads.data());
  const float* lw = weighted ? loss_weights.data() : nullptr;
  pass.fused =
      model->Forward(access, tokens.data(), targets.data(), lw, ForwardOptions::Fused(kLossScale));
  pass.losses.assign(model->losses(), model->losses() + B * T);
  model->Backward(access, kLossScale);
  pass.scored = model->Forward(access, tokens.data(), targets.data(), lw, ForwardOptions::Scored());
  pass.scored_losses.assign(model->losses(), model->losses() + B * T);
  pass.predictions.assign(model->predictions(), model->predictions() + B * T);
  return pass;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

void ExpectTheWholeModelsBits(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  for (const std::string& o : overrides) config.ApplyOverride(o);
  const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
  Communicator& group = TensorGroup();
  const ModelParallelism whole = ModelParallelism::Layout(1, 0, kChunks);
  ModelParallelism part = ModelParallelism::TensorParallel(group, kChunks);
  const ParameterTable whole_table = spec->BuildTable(whole);
  const ParameterTable part_table = spec->BuildTable(part);
  std::vector<float> weights(whole_table.total()), part_weights(part_table.total()),
      own_init(part_table.total());
  spec->InitWeights(whole_table, 9, 0, weights.size(), weights.data());
  CopyWholeToParts(whole_table, weights.data(), part_table, part_weights.data());
  // A part initialises alone to the whole's bits.
  spec->InitWeights(part_table, 9, 0, own_init.size(), own_init.data());
  EXPECT_TRUE(SameBits(own_init, part_weights));
  for (const bool weighted : {false, true})
    for (const bool sequence_parallel : {false, true}) {
      SCOPED_TRACE(std::string(weighted ? "weighted" : "unweighted") + ", tensor-parallel degree " +
                   std::to_string(group.size()) + (sequence_parallel ? ", sequence parallel" : ""));
      part.sequence_parallel = sequence_parallel;
      const Pass one = Run(*spec, whole, weights, weighted);
      const Pass split = Run(*spec, part, part_weights, weighted);
      EXPECT_EQ(std::memcmp(&one.fused, &split.fused, sizeof(LossSum)), 0)
          << one.fused.loss << " vs " << split.fused.loss;
      EXPECT_EQ(std::memcmp(&one.scored, &split.scored, sizeof(LossSum)), 0);
      EXPECT_TRUE(SameBits(one.losses, split.losses));
      EXPECT_TRUE(SameBits(one.scored_losses, split.scored_losses));
      EXPECT_EQ(one.predictions, split.predictions);
      std::vector<float> expected(part_table.total());
      CopyWholeToParts(whole_table, one.grads.data(), part_table, expected.data());
      EXPECT_TRUE(SameBits(expected, split.grads));
      // Not vacuous: gradients that are not all zeros, and a loss near ln(V).
      size_t zeros = 0;
      for (float g : split.grads) zeros += g == 0.0f;
      EXPECT_LT(zeros, split.grads.size() / 2);
    }
}

const std::vector<std::string> kModel = {"model.vocab_size=256",      "model.dim=64",
                                         "model.n_layers=2",          "model.n_heads=8",
                                         "model.n_kv_heads=4",        "model.ffn_hidden_dim=96",
                                         "model.tie_embeddings=false"};

TEST(TensorParallel, AnUntiedLlamaHasTheWholeModelsBitsOnEveryDegree) {
  ExpectTheWholeModelsBits(kModel);
}

TEST(TensorParallel, ATiedLlamaHasTheWholeModelsBitsOnEveryDegree) {
  std::vector<std::string> tied = kModel;
  tied.back() = "model.tie_embeddings=true";
  ExpectTheWholeModelsBits(tied);
}

}  // namespace
}  // namespace crucible
