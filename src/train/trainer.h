// The training loop: wires the token source, the model, exact gradient accumulation, clipping,
// the optimizer and the LR schedule; prints the progress-line contract; writes the run
// directory (config.toml, metrics.jsonl, model.safetensors) and checkpoints
// (train/checkpointing.h).
#pragma once

#include <string>

#include "common/config.h"

namespace crucible {

// Runs `crucible train` to completion; returns the process exit code (0, or 143 when stopped by
// SIGTERM/SIGUSR1 after a checkpoint). Throws crucible::Error. `resume_mode`: "auto" (the newest
// checkpoint that verifies, if the run directory has any), "none", or a checkpoint folder.
int RunTraining(Config config, const std::string& resume_mode = "auto");

// The run directory of a config: [job] dump_folder, or runs/<job.name>.
std::string RunDirectory(const Config& config);

}  // namespace crucible
