// The host-side transcendental functions whose results reach a training run's bits: weight
// init's normal sampling (common/philox.h), the RoPE tables (kernels::rope_tables), the cosine
// learning-rate schedule and AdamW's bias corrections. By default they are libm's, as always;
// under `[debug] portable_exact` (the Trainer calls SetPortableHostMath(true) before it builds
// the model) they are compute/portable/portable_math.h's, so a host with another glibc or
// compiler (the GPU machine's) computes the same bits.
//
// Functions whose results only reach log lines or warnings (the step-1 loss detector's
// ln(vocab), MFU, the LR finder's plot) keep libm; sqrt is correctly rounded everywhere.
#pragma once

namespace crucible {

// Process-wide; set once at the start of a run (tests may toggle it between cases).
void SetPortableHostMath(bool portable);
bool PortableHostMath();

double HostLog(double x);
double HostSin(double x);
double HostCos(double x);
double HostPow(double x, double y);

}  // namespace crucible
