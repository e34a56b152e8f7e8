// The portable exact CPU backend (compute/portable_backend.cc): what the "cpu" device builds when
// BackendOptions::portable_exact is set. Its kernels are compute/portable/portable_kernels.h, the
// same source a GPU backend compiles, so `crucible smoke --portable` has one golden for every
// device. float32 compute only (UsageError, exit 2, for bfloat16).
#pragma once

#include <memory>

#include "compute/backend.h"

namespace crucible {

std::unique_ptr<ComputeBackend> BuildPortableBackend(const BackendOptions& options);

// `options` when its compute is float32; UsageError (exit 2) naming the keys otherwise. Every
// portable backend (this one, the GPU's in compute/cuda/) checks its options with it.
const BackendOptions& RequirePortableFloat32(const BackendOptions& options);

}  // namespace crucible
