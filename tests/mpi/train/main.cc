// `crucible train` with one more optimizer: a toy whole-matrix optimizer registered in this file
// alone, so that tests/integration/test_whole_matrix_zero.py can train it under mpirun on any
// number of ranks and ZeRO stage (the crucible binary has no whole-matrix optimizer yet).
//
//   mpirun -np N test_mpi_train [--resume auto|none|PATH] [--set section.key=value ...]
//
// The config starts from the defaults, like `crucible train` without --config; the exit code is
// RunTraining's (or an Error's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/error.h"
#include "optim/optimizer.h"
#include "train/trainer.h"

namespace crucible {
namespace {

// Row-normalised momentum, with per-element and per-tensor state:
//   m = beta1 m + (1 - beta1) g                    (per element, "momentum")
//   rho_r = rms of row r of m                      (a matrix's rows; a vector is one row)
//   s = beta2 s + (1 - beta2) max_r rho_r          (per tensor, "row_rms_avg")
//   w = w (1 - lr wd) - lr m_r / (rho_r + 0.1 s + eps)   for each row r
// A row's step depends on the whole row and s on the whole tensor: kWholeMatrix. The sums run in
// double in element order, on one thread, so the bits depend on nothing but the tensor.
class ToyRowNormalizedMomentum final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kWholeMatrix; }
  std::vector<StateSpec> state() const override { return {{"momentum"}, {"row_rms_avg", 1}}; }
  void Update(const TensorUpdate& u) const override {
    const size_t rows = u.param.shape.size() >= 2 ? static_cast<size_t>(u.param.shape[0]) : 1;
    const size_t columns = u.weights.size() / rows;
    const float beta1 = static_cast<float>(u.group.beta1);
    float* momentum = u.state[0].data();
    for (size_t i = 0; i < u.weights.size(); ++i)
      momentum[i] = beta1 * momentum[i] + (1.0f - beta1) * u.grads[i];
    std::vector<double> rms(rows);
    for (size_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (size_t c = 0; c < columns; ++c)
        sum += double(momentum[r * columns + c]) * momentum[r * columns + c];
      rms[r] = std::sqrt(sum / static_cast<double>(columns));
    }
    const double beta2 = u.group.beta2;
    const double average =
        beta2 * u.state[1][0] + (1 - beta2) * *std::max_element(rms.begin(), rms.end());
    u.state[1][0] = static_cast<float>(average);
    const float decay = 1.0f - static_cast<float>(u.lr * u.group.weight_decay);
    for (size_t r = 0; r < rows; ++r) {
      const float scale = static_cast<float>(u.lr / (rms[r] + 0.1 * average + u.group.eps));
      for (size_t c = 0; c < columns; ++c) {
        const size_t i = r * columns + c;
        u.weights[i] = u.weights[i] * decay - scale * momentum[i];
      }
    }
  }
};
OptimizerRegistrar toy_row_normalized_momentum(
    "ToyRowNormalizedMomentum", [](const Config&) -> std::unique_ptr<Optimizer> {
      return std::make_unique<ToyRowNormalizedMomentum>();
    });

}  // namespace
}  // namespace crucible

int main(int argc, char** argv) {
  using namespace crucible;
  try {
    Config config = Config::Defaults();
    std::string resume = "auto";
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (i + 1 < argc && arg == "--resume")
        resume = argv[++i];
      else if (i + 1 < argc && arg == "--set")
        config.ApplyOverride(argv[++i]);
      else
        throw UsageError("unknown argument '" + arg +
                         "' (usage: test_mpi_train [--resume MODE] "
                         "[--set section.key=value ...])");
    }
    return RunTraining(config, resume);
  } catch (const Error& e) {
    std::fprintf(stderr, "test_mpi_train: error: %s\n", e.what());
    return e.exit_code();
  }
}
