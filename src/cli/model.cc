// crucible model info|init|grads: inspect a model config, write initial weights, and run one
// forward/backward on a given batch (the hook the PyTorch reference tests use).
#include <memory>

#include "ckpt/model_weights.h"
#include "ckpt/safetensors.h"
#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"
#include "model/llama.h"

namespace crucible {
namespace {

struct ModelOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string weights, batch, out;
};

Config LoadModelConfig(const ModelOptions& o) {
  if (o.config_path.empty()) {
    Config config = Config::Defaults();
    for (const auto& s : o.overrides) config.ApplyOverride(s);
    return config;
  }
  return Config::Load(o.config_path, o.overrides);
}

void AddConfigOptions(CLI::App* app, ModelOptions* o) {
  app->add_option("-c,--config", o->config_path, "TOML config file");
  app->add_option("--set", o->overrides, "override a key: section.key=value")->take_all();
}

CommandRun SetupModel(CLI::App& app) {
  auto o = std::make_shared<ModelOptions>();
  app.require_subcommand(1);
  CLI::App* info = app.add_subcommand("info", "print the parameter table of the configured model");
  AddConfigOptions(info, o.get());
  CLI::App* init = app.add_subcommand("init", "write the initial weights as safetensors");
  AddConfigOptions(init, o.get());
  init->add_option("--out", o->out, "output .safetensors file")->required();
  CLI::App* grads = app.add_subcommand(
      "grads", "forward and backward on one batch; write logits, losses and gradients");
  AddConfigOptions(grads, o.get());
  grads->add_option("--weights", o->weights, "weights (.safetensors, Hugging Face names)")
      ->required();
  grads
      ->add_option("--batch", o->batch,
                   "batch (.safetensors with I32 tensors 'tokens' and 'targets' of shape [B, T]; "
                   "target -1 is ignored)")
      ->required();
  grads->add_option("--out", o->out, "output .safetensors file")->required();

  return [o, info, init, grads]() {
    Config config = LoadModelConfig(*o);
    config.Validate();
    LlamaConfig m = BuildLlamaConfig(config);
    if (info->parsed()) {
      const ParameterTable table = LlamaParameterTable(m);
      for (const auto& p : table.params())
        std::printf("%-48s %-14s offset=%zu\n", p.name.c_str(), ShapeString(p.shape).c_str(),
                    p.offset);
      std::printf("total_params=%zu flop_params=%zu flops_per_token(seq_len=%lld)=%.4g\n",
                  table.total(), table.FlopParams(), (long long)config.Int("training.seq_len"),
                  TrainFlopsPerToken(m, table, config.Int("training.seq_len")));
      return 0;
    }
    if (init->parsed()) {
      const ParameterTable table = LlamaParameterTable(m);
      std::vector<float> weights(table.total());
      InitWeights(m, table, static_cast<uint64_t>(config.Int("debug.seed")), weights.data());
      SaveModelWeights(o->out, table, m, weights.data());
      return 0;
    }
    // grads
    SafetensorsReader batch(o->batch);
    const TensorEntry* tokens = batch.Find("tokens");
    const TensorEntry* targets = batch.Find("targets");
    if (!tokens || !targets || tokens->dtype != "I32" || targets->dtype != "I32" ||
        tokens->shape.size() != 2 || tokens->shape != targets->shape)
      throw DataError(o->batch +
                      ": expected I32 tensors 'tokens' and 'targets' of the same shape [B, T]");
    const int64_t B = tokens->shape[0], T = tokens->shape[1];
    LlamaModel model(m, B, T);
    std::vector<float> weights(model.table().total()), gradients(model.table().total());
    LoadModelWeights(o->weights, model.table(), weights.data());
    std::vector<int32_t> token_ids(B * T), target_ids(B * T);
    batch.ReadInt32("tokens", token_ids.data());
    batch.ReadInt32("targets", target_ids.data());
    for (int32_t t : token_ids)
      if (t < 0 || t >= m.vocab_size)
        throw DataError(o->batch + ": token id " + std::to_string(t) +
                        " is outside the vocabulary");
    int64_t valid = 0;
    double loss_sum = model.Forward(weights.data(), token_ids.data(), target_ids.data(), &valid);
    std::vector<float> logits(model.logits(), model.logits() + B * T * m.vocab_size);
    std::vector<float> losses(model.losses(), model.losses() + B * T);
    float scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
    model.Backward(weights.data(), gradients.data(), scale);
    float loss = valid > 0 ? static_cast<float>(loss_sum / valid) : 0.0f;
    std::vector<TensorView> views = {{"loss", {}, &loss},
                                     {"logits", {B, T, m.vocab_size}, logits.data()},
                                     {"losses", {B, T}, losses.data()}};
    for (const auto& p : model.table().params())
      views.push_back({"grad." + p.name, p.shape, gradients.data() + p.offset});
    WriteSafetensors(o->out, views, {{"valid_tokens", std::to_string(valid)}});
    std::printf("loss=%.9g valid_tokens=%lld\n", loss, (long long)valid);
    return 0;
  };
}

CommandRegistrar model_registrar("model", "inspect a model, write initial weights, dump gradients",
                                 SetupModel);

}  // namespace
}  // namespace crucible
