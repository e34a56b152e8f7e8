#include "train/gemm_ceiling.h"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/kernels.h"

extern "C" char* openblas_get_config(void);

namespace crucible {
namespace {

constexpr int64_t kMaxRows = 1024;

std::string ShapeName(const GemmShape& s) {
  return StrFormat("%lldx%lldx%lld", (long long)s.rows, (long long)s.in, (long long)s.out);
}

// The best GFLOP/s of `run` over at least 3 runs, at most 10, or until 0.4 s have passed.
template <typename Fn>
double BestRate(double flops, Fn run) {
  double best = 0;
  Timer total;
  for (int repeat = 0; repeat < 10 && (repeat < 3 || total.Seconds() < 0.4); ++repeat) {
    Timer t;
    run();
    best = std::max(best, flops / t.Seconds() / 1e9);
  }
  return best;
}

}  // namespace

std::vector<GemmShape> ModelGemmShapes(const ParameterTable& table, int64_t rows) {
  bool has_head = false;
  for (const ParamInfo& p : table.params()) has_head |= p.kind == ParamKind::kHead;
  std::vector<GemmShape> shapes;
  for (const ParamInfo& p : table.params()) {
    if (p.shape.size() != 2 || p.kind == ParamKind::kNorm) continue;
    if (p.kind == ParamKind::kEmbedding && has_head) continue;  // a lookup, not a product
    const GemmShape s{std::min(rows, kMaxRows), p.shape[1], p.shape[0]};
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  }
  return shapes;
}

std::vector<GemmShapeRate> MeasureGemmShapes(const std::vector<GemmShape>& shapes) {
  std::vector<GemmShapeRate> rates;
  for (const GemmShape& s : shapes) {
    std::vector<float> a(s.rows * s.in), w(s.out * s.in), c(s.rows * s.out);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.1f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 5) * 0.1f;
    const double flops = 2.0 * s.rows * s.in * s.out;
    const double tiled = BestRate(
        flops, [&] { kernels::matmul_forward(c.data(), a.data(), w.data(), s.rows, s.in, s.out); });
    const double blas = BestRate(flops, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.rows, s.out, s.in, 1.0f, a.data(),
                  s.in, w.data(), s.in, 0.0f, c.data(), s.out);
    });
    const double onednn = BestRate(flops, [&] {
      dnnl_sgemm('N', 'T', s.rows, s.out, s.in, 1.0f, a.data(), s.in, w.data(), s.in, 0.0f,
                 c.data(), s.out);
    });
    rates.push_back({s, std::max({tiled, blas, onednn})});
  }
  return rates;
}

std::vector<GemmShapeRate> MeasureBackendGemmShapes(ComputeBackend& backend,
                                                    const std::vector<GemmShape>& shapes) {
  std::vector<GemmShapeRate> rates;
  for (const GemmShape& s : shapes) {
    DeviceArray<float> a(backend, s.rows * s.in), w(backend, s.out * s.in),
        c(backend, s.rows * s.out);
    backend.Fill(a.data(), a.size(), 0.1f);
    backend.Fill(w.data(), w.size(), 0.1f);
    auto run = [&] {
      backend.MatmulForward(c.data(), a.data(), w.data(), s.rows, s.in, s.out);
      backend.Synchronize();
    };
    run();  // untimed: the library's first call picks its algorithm
    rates.push_back({s, BestRate(2.0 * s.rows * s.in * s.out, run)});
  }
  return rates;
}

double MeasureBackendGemmCeiling(ComputeBackend& backend, const std::vector<GemmShape>& shapes) {
  double best = 0;
  for (const GemmShapeRate& r : MeasureBackendGemmShapes(backend, shapes))
    best = std::max(best, r.gflops);
  return best;
}

std::string GemmCeilingCpuKey(std::istream& cpuinfo) {
  std::map<std::string, std::string> first;  // each field's value on the first processor
  for (std::string line; std::getline(cpuinfo, line);) {
    const size_t colon = line.find(':');
    if (colon != std::string::npos)
      first.emplace(Trim(line.substr(0, colon)), Trim(line.substr(colon + 1)));  // keeps the first
  }
  auto field = [&](const char* name, const char* missing) {
    const auto it = first.find(name);
    return it == first.end() ? std::string(missing) : it->second;
  };
  std::set<std::string> flags;
  std::istringstream words(field("flags", ""));
  for (std::string w; words >> w;) flags.insert(w);
  std::string features;
  for (const char* f : {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    if (flags.count(f)) features += (features.empty() ? "" : ",") + std::string(f);
  return StrFormat("cpu=%s;family=%s;model=%s;stepping=%s;features=%s",
                   field("model name", "unknown").c_str(), field("cpu family", "?").c_str(),
                   field("model", "?").c_str(), field("stepping", "?").c_str(), features.c_str());
}

std::string GemmCeilingKey(int ranks_on_host, const std::vector<GemmShape>& shapes,
                           const ComputeBackend* backend) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const dnnl_version_t* onednn = dnnl_version();
  std::string key = StrFormat(
      "v3;%s;blas=%s;onednn=%d.%d.%d "
      "%s;gemm=%s;threads=%d;ranks_on_host=%d;shapes=",
      GemmCeilingCpuKey(cpuinfo).c_str(), Trim(openblas_get_config()).c_str(), onednn->major,
      onednn->minor, onednn->patch, kernels::GemmIsaName(kernels::gemm_isa()),
      kernels::GemmLibraryRule().c_str(), omp_get_max_threads(), ranks_on_host);
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i > 0) key += ',';
    key += ShapeName(shapes[i]);
  }
  if (backend) key += ";backend=" + backend->Summary();
  return key;
}

std::string GemmCeilingCachePath() {
  std::string root;
  if (const char* c = std::getenv("CRUCIBLE_CACHE"); c && *c) {
    root = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    root = JoinPath(x, "crucible");
  } else {
    const char* home = std::getenv("HOME");
    root = JoinPath(JoinPath(home && *home ? home : "/tmp", ".cache"), "crucible");
  }
  return JoinPath(root, "gemm-ceiling.json");
}

namespace {
// The cache's entries (an empty object when the file is absent or unreadable: `warn` says so).
nlohmann::json ReadCache(const std::string& path, bool warn) {
  if (!FileExists(path)) return nlohmann::json::object();
  try {
    nlohmann::json cache = nlohmann::json::parse(ReadConfigFile(path));
    if (!cache.is_object()) throw std::runtime_error("not a JSON object");
    return cache;
  } catch (const std::exception& e) {
    if (warn)
      LogWarn(StrFormat("%s: unreadable (%s); measuring the GEMM ceiling again", path.c_str(),
                        e.what()));
    return nlohmann::json::object();
  }
}
}  // namespace

double LookupGemmCeiling(const std::string& path, const std::string& key) {
  const nlohmann::json cache = ReadCache(path, true);
  const auto entry = cache.find(key);
  if (entry == cache.end() || !entry->is_object()) return 0;
  const auto gflops = entry->find("gflops");
  return gflops != entry->end() && gflops->is_number() && gflops->get<double>() > 0
             ? gflops->get<double>()
             : 0;
}

double MeasureAndCacheGemmCeiling(const std::vector<GemmShape>& shapes, const std::string& path,
                                  const std::string& key, ComputeBackend* backend) {
  const std::vector<GemmShapeRate> rates =
      backend ? MeasureBackendGemmShapes(*backend, shapes) : MeasureGemmShapes(shapes);
  // Re-read just before writing: another process may have added its entry meanwhile.
  nlohmann::json cache = ReadCache(path, false);
  // A measurement can only come out too low (the machine busy, or in a slower phase), so one
  // cached before under this key is merged by the maximum, overall and per shape.
  auto number = [](const nlohmann::json& object, const std::string& name) {
    const auto it = object.is_object() ? object.find(name) : object.end();
    return it != object.end() && it->is_number() ? std::max(it->get<double>(), 0.0) : 0.0;
  };
  const nlohmann::json before = cache.contains(key) ? cache[key] : nlohmann::json::object();
  const nlohmann::json before_shapes =
      before.is_object() && before.contains("shapes") ? before["shapes"] : nlohmann::json::object();
  double best = number(before, "gflops");
  nlohmann::json per_shape = before_shapes.is_object() ? before_shapes : nlohmann::json::object();
  for (const GemmShapeRate& r : rates) {
    const std::string name = ShapeName(r.shape);
    const double rate = std::max(r.gflops, number(before_shapes, name));
    best = std::max(best, rate);
    per_shape[name] = rate;
  }
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  cache[key] = {{"gflops", best}, {"measured_at", when}, {"shapes", per_shape}};
  try {
    MakeDirectories(ParentDirectory(path));
    AtomicWriteFile(path, cache.dump(2) + "\n");
  } catch (const std::exception& e) {
    LogWarn(StrFormat("the GEMM ceiling was measured but not cached: %s", e.what()));
  }
  return best;
}

}  // namespace crucible
