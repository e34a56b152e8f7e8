// Timings of the data pipeline's hot parts, for bench/data_vs_megatron.py (which runs the peers
// side by side and prints ratios):
//   data_bench blend-index WEIGHTS_FILE SAMPLES OUT_PREFIX
//       builds the blend index for the weights (one per line) and prints
//       "blend_index samples=N datasets=D seconds=S cpu_seconds=C max_prefix_error=E" (wall and
//       process CPU time: CPU time holds up on a busy machine); writes OUT_PREFIX.dataset
//       (uint16) and OUT_PREFIX.sample (int64) so the caller can compare against Megatron's.
//   data_bench loader FILE_LIST SEQ_LEN GLOBAL_BATCH BATCHES [SEED]
//       reads BATCHES global batches through DataLoader (rank 0 of 1, one prefetch thread) and
//       prints "loader samples=N tokens=T seconds=S tokens_per_s=R".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/timer.h"
#include "data/blend_index.h"
#include "data/blended_dataset.h"
#include "data/loader.h"

namespace crucible {
namespace {

int BlendIndexBench(const std::string& weights_file, int64_t samples, const std::string& out) {
  std::vector<double> weights;
  std::ifstream in(weights_file);
  for (double w; in >> w;) weights.push_back(w);
  std::vector<uint16_t> dataset(samples);
  std::vector<int64_t> sample(samples);
  Timer timer;
  const std::clock_t cpu_start = std::clock();
  BuildBlendIndex(weights, samples, dataset.data(), sample.data());
  const double seconds = timer.Seconds();
  const double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  double total = 0;
  for (double w : weights) total += w;
  double worst = 0;
  for (int64_t i = 0; i < samples; ++i) {
    const double share = weights[dataset[i]] / total;
    worst = std::max(
        {worst, std::abs(sample[i] - i * share), std::abs(sample[i] + 1 - (i + 1) * share)});
  }
  std::printf(
      "blend_index samples=%lld datasets=%zu seconds=%.4f cpu_seconds=%.4f max_prefix_error=%.4f\n",
      (long long)samples, weights.size(), seconds, cpu_seconds, worst);
  AtomicWriteFile(out + ".dataset", dataset.data(), dataset.size() * 2);
  AtomicWriteFile(out + ".sample", sample.data(), sample.size() * 8);
  return 0;
}

int LoaderBench(const std::string& list, int64_t seq_len, int64_t global_batch, int64_t batches,
                uint64_t seed) {
  BlendOptions options;
  options.file_list = list;
  options.seq_len = seq_len;
  options.seed = seed;
  options.num_samples = global_batch * batches;
  options.progress = false;
  auto blend = BlendedDataset::Open(options);
  // Warm: the first sample of each shard verifies its checksum; not part of the steady state.
  std::vector<int32_t> warm(seq_len + 1);
  for (int64_t i = 0; i < std::min<int64_t>(blend->size(), 4096); ++i)
    blend->Sample(i, warm.data());
  DataLoader loader(*blend, seq_len, global_batch, 0, 1, 0);
  Timer timer;
  int64_t checksum = 0;
  for (int64_t k = 0; k < batches; ++k) checksum += loader.Next().inputs[k % seq_len];
  const double seconds = timer.Seconds();
  const int64_t samples = global_batch * batches;
  std::printf("loader samples=%lld tokens=%lld seconds=%.4f tokens_per_s=%.0f checksum=%lld\n",
              (long long)samples, (long long)(samples * seq_len), seconds,
              samples * seq_len / seconds, (long long)checksum);
  return 0;
}

}  // namespace
}  // namespace crucible

int main(int argc, char** argv) {
  using namespace crucible;
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "blend-index" && argc == 5)
      return BlendIndexBench(argv[2], std::stoll(argv[3]), argv[4]);
    if (mode == "loader" && (argc == 6 || argc == 7))
      return LoaderBench(argv[2], std::stoll(argv[3]), std::stoll(argv[4]), std::stoll(argv[5]),
                         argc == 7 ? std::stoull(argv[6]) : 0);
    std::fprintf(stderr,
                 "usage: data_bench blend-index WEIGHTS_FILE SAMPLES OUT_PREFIX\n"
                 "       data_bench loader FILE_LIST SEQ_LEN GLOBAL_BATCH BATCHES [SEED]\n");
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "data_bench: error: %s\n", e.what());
    return e.exit_code();
  }
}
