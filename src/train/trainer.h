// The training loop: wires the token source, the model, exact gradient accumulation, clipping,
// the optimizer and the LR schedule; prints the progress-line contract; writes the run
// directory (config.toml, metrics.jsonl, model.safetensors).
#pragma once

#include <string>

#include "common/config.h"

namespace crucible {

// Runs `crucible train` to completion; returns the process exit code. Throws crucible::Error.
int RunTraining(Config config);

// The run directory of a config: [job] dump_folder, or runs/<job.name>.
std::string RunDirectory(const Config& config);

// Peak fp32 GFLOP/s of this machine, measured as the best of several 1024^3 sgemm runs on all
// OpenMP threads (about a third of a second).
double MeasurePeakGflops();

}  // namespace crucible
