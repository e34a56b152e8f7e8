// bfloat16 rounding of float32 values, for code that emulates bf16 storage exactly in float32
// (the trainer's bf16 weight storage, Muon's bf16 Newton-Schulz).
#pragma once

namespace crucible {

// `value` rounded to the nearest bfloat16 (ties to even), as float32; inf and NaN unchanged.
float RoundToBfloat16(float value);

}  // namespace crucible
