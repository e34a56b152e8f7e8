// The backend registry, and the names of the precisions.
#include "compute/backend.h"

#include "common/error.h"
#include "common/registry.h"

namespace crucible {
namespace {

Registry<BackendFactory>& Backends() {
  static Registry<BackendFactory> registry("device");
  return registry;
}

}  // namespace

const char* ComputePrecisionName(ComputePrecision precision) {
  return precision == ComputePrecision::kBfloat16 ? "bfloat16" : "float32";
}

BackendRegistrar::BackendRegistrar(const char* name, BackendFactory build) {
  Backends().Add(name, build);
}

std::vector<std::string> RegisteredBackends() {
  return Backends().Names();
}

std::shared_ptr<ComputeBackend> MakeBackend(const BackendOptions& options) {
  const auto& entries = Backends().entries();
  if (options.device == "cuda" && !entries.count("cuda"))
    throw UsageError(
        "training.device = \"cuda\": this crucible was built without the CUDA backend; rebuild "
        "where the CUDA toolkit (nvcc) is installed (cmake -DCRUCIBLE_CUDA=ON), or set "
        "training.device = \"cpu\"");
  return Backends().Find(options.device, "training.device")(options);
}

std::shared_ptr<ComputeBackend> DefaultCpuBackend() {
  static const std::shared_ptr<ComputeBackend> cpu = MakeBackend(BackendOptions{});
  return cpu;
}

}  // namespace crucible
