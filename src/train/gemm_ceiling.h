// The GEMM ceiling of this machine for a model (fp32; in bf16 compute, below, the backend's own):
// the best GFLOP/s that matrix products of the model's own shapes reach here, measured once and
// cached, so MFU ("share of the ceiling") means the same from run to run. (A fresh 1024^3 sgemm at
// every start varied from 77 to 177 GFLOP/s across runs of one machine: whatever else ran at that
// half second decided it.)
//
// Measured: for each distinct (in, out) shape of the model's matrix products (the linear layers
// and the head, kernels::matmul_forward's (N,C) x (OC,C)^T with N = min(rows, 1024) rows), the
// best of several runs of Crucible's tiled matmul_forward (on the libraries it chose), one
// multithreaded cblas_sgemm and one multithreaded dnnl_sgemm over the same operands; the ceiling
// is the best of all of them, so it stays the best any library reaches here. Every local rank
// measures at the same time, so the shares of a shared machine add up.
//
// Cached in <cache>/gemm-ceiling.json (<cache>: $CRUCIBLE_CACHE, else $XDG_CACHE_HOME/crucible,
// else ~/.cache/crucible), one entry per key: a version ("v3": entries keyed without the CPU's
// family and model, v2 and before, are not reused), the CPU's model name, family, model and
// stepping (a VM's name alone, "AMD EPYC", is the same on Zen 4 and Zen 5, whose ceilings differ
// 2x), its vector features (avx2, avx512f, avx512_bf16, amx), the BLAS build, oneDNN's version and
// ISA, the products' library rule, the OpenMP threads, the ranks sharing the host, and the shapes.
// A key present is used as is ("cached"); metrics.remeasure_peak measures again and keeps the
// higher of the two (a 2-core Zen 5 VM cached 432 GFLOP/s in a slow afternoon and measured 498
// that night: every MFU in between read 15% high). A cache that cannot be read or written costs a
// warning and a measurement, never the run.
//
// In bf16 compute the ceiling is that of the backend's own products instead (its MatmulForward
// over the same shapes: on the CPU the AMX or AVX-512 BF16 tiles, or the emulation's rounding and
// fp32 products), keyed by the same fields plus the backend's summary ("backend=device=cpu
// compute=bfloat16 bf16_path=amx"): a bf16 step on AMX runs its products at 3x the fp32
// ceiling, so against that ceiling every bf16 step read as "faster than the peak" (mfu=nan).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "compute/backend.h"
#include "model/parameters.h"

namespace crucible {

struct GemmShape {
  int64_t rows = 0, in = 0, out = 0;  // (rows, in) x (out, in)^T
  bool operator==(const GemmShape&) const = default;
};

// The distinct matrix-product shapes of `table`'s 2-D weights that take part in products
// (linear layers, the head, or the embedding where the head is tied to it), with `rows` rows
// (capped at 1024), in table order.
std::vector<GemmShape> ModelGemmShapes(const ParameterTable& table, int64_t rows);

struct GemmShapeRate {
  GemmShape shape;
  double gflops = 0;  // best over the runs and both implementations
};

// Measures every shape (collective-free; each call takes about a second or two).
std::vector<GemmShapeRate> MeasureGemmShapes(const std::vector<GemmShape>& shapes);
// Measures every shape through `backend`'s MatmulForward in its compute precision, each timed
// between two Synchronize calls after one untimed run.
std::vector<GemmShapeRate> MeasureBackendGemmShapes(ComputeBackend& backend,
                                                    const std::vector<GemmShape>& shapes);

// A backend whose memory is not the host's (a GPU): the best of MeasureBackendGemmShapes. Not
// cached: it takes well under a second.
double MeasureBackendGemmCeiling(ComputeBackend& backend, const std::vector<GemmShape>& shapes);

// The CPU's part of the key, from /proc/cpuinfo's text: the first processor's model name, family,
// model and stepping and its vector features, "cpu=AMD EPYC;family=26;model=2;stepping=1;
// features=avx2,fma,avx512f,avx512_bf16" ("unknown", "?" and nothing where a field is missing).
// The name alone does not tell CPUs apart: a cloud VM reports "AMD EPYC" on Zen 4 and on Zen 5.
std::string GemmCeilingCpuKey(std::istream& cpuinfo);
// This machine's key: "v3;<GemmCeilingCpuKey>;blas=...;onednn=2.6.3 avx512;gemm=auto;threads=N;
// ranks_on_host=R;shapes=...", and ";backend=<its Summary()>" when `backend` is given (bf16).
std::string GemmCeilingKey(int ranks_on_host, const std::vector<GemmShape>& shapes,
                           const ComputeBackend* backend = nullptr);
// The cache file's path.
std::string GemmCeilingCachePath();

// The cached ceiling of `key` in the file at `path` (0 when there is none; an unreadable file is
// a warning and 0).
double LookupGemmCeiling(const std::string& path, const std::string& key);
// Measures `shapes` (MeasureGemmShapes, or MeasureBackendGemmShapes when `backend` is given) and
// records the best under `key` in the file at `path` (atomically; a failure to write is a
// warning). An entry already under `key` is merged by the maximum, overall and per shape: a
// measurement can only come out too low (the machine busy or in a slower phase), so measuring
// again (metrics.remeasure_peak) never lowers a ceiling. Returns the ceiling.
double MeasureAndCacheGemmCeiling(const std::vector<GemmShape>& shapes, const std::string& path,
                                  const std::string& key, ComputeBackend* backend = nullptr);

}  // namespace crucible
