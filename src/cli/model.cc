// crucible model info|init|grads: inspect a model config, write initial weights, and run one
// forward/backward on a given batch (the hook the PyTorch reference tests use).
#include "model/model.h"

#include <memory>

#include "ckpt/model_weights.h"
#include "ckpt/safetensors.h"
#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"
#include "train/training_config.h"

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
    const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
    if (info->parsed()) {
      const ParameterTable table = spec->BuildTable();
      for (const auto& p : table.params())
        std::printf("%-48s %-14s offset=%zu\n", p.name.c_str(), ShapeString(p.shape).c_str(),
                    p.offset);
      std::printf(
          "total_params=%zu active_params=%.0f flop_params=%zu "
          "flops_per_token(seq_len=%lld)=%.4g\n",
          table.total(),
          spec->PlannedSizes().active > 0 ? spec->PlannedSizes().active : double(table.total()),
          table.FlopParams(), (long long)config.Int("training.seq_len"),
          spec->TrainFlopsPerToken(table, config.Int("training.seq_len")));
      return 0;
    }
    if (init->parsed()) {
      const ParameterTable table = spec->BuildTable();
      std::vector<float> weights(table.total());
      spec->InitWeights(table, static_cast<uint64_t>(config.Int("debug.seed")), 0, table.total(),
                        weights.data());
      SaveModelWeights(o->out, table, *spec, weights.data());
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
    // [training] device and mixed_precision_param pick the backend, as in training.
    const std::unique_ptr<Model> model =
        spec->Build(B, T, MakeBackend(BuildBackendOptions(config)));
    const ParameterTable& table = model->table();
    const int64_t V = spec->vocab_size();
    std::vector<float> weights(table.total()), gradients(table.total());
    LoadModelWeights(o->weights, table, weights.data());
    std::vector<int32_t> token_ids(B * T), target_ids(B * T);
    batch.ReadInt32("tokens", token_ids.data());
    batch.ReadInt32("targets", target_ids.data());
    for (int32_t t : token_ids)
      if (t < 0 || t >= V)
        throw DataError(o->batch + ": token id " + std::to_string(t) +
                        " is outside the vocabulary");
    FlatParameterAccess access(table, weights.data(), gradients.data());
    const LossSum sum = model->Forward(access, token_ids.data(), target_ids.data(), nullptr,
                                       ForwardOptions::Logits());
    const int64_t valid = static_cast<int64_t>(sum.weight);  // the count: no loss weights
    std::vector<float> logits(model->logits(), model->logits() + B * T * V);
    std::vector<float> losses(model->losses(), model->losses() + B * T);
    float scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
    model->Backward(access, scale);
    float loss = valid > 0 ? static_cast<float>(sum.loss / valid) : 0.0f;
    // The gradients are those of loss + aux_loss (an auxiliary loss, LossSum::aux, when the model
    // has one); "loss" stays the cross-entropy.
    float aux_loss = valid > 0 ? static_cast<float>(sum.aux / valid) : 0.0f;
    std::vector<TensorView> views = {{"loss", {}, &loss},
                                     {"logits", {B, T, V}, logits.data()},
                                     {"losses", {B, T}, losses.data()}};
    if (spec->has_aux_loss()) views.push_back({"aux_loss", {}, &aux_loss});
    for (const auto& p : table.params())
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
