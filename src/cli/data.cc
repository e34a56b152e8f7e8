// crucible data prepare|blend|verify|inspect: text/jsonl -> Megatron shards with manifests, the
// cached blend index of a file list, re-checking shards against their manifests, and a report of
// a blend (realised mixture against the weights, document/token statistics, decoded samples).
// See docs/data.md.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "cli/command.h"
#include "common/error.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "data/blended_dataset.h"
#include "data/file_list.h"
#include "data/indexed_dataset.h"
#include "data/manifest.h"
#include "data/prepare.h"
#include "data/stage_mixture.h"
#include "data/stages.h"
#include "data/token_source.h"
#include "tokenizer/tokenizer.h"
#include "train/training_config.h"

namespace crucible {
namespace {

struct DataOptions {
  // prepare
  std::vector<std::string> inputs;
  std::string output, tokenizer, field = "text", format = "auto", split = "file", eos_token;
  bool quiet = false;
  // blend / verify / inspect
  std::string list, cache_dir;
  int64_t seq_len = 0, samples = 0, decode = 2;
  uint64_t seed = 0;
  std::vector<std::string> prefixes;
  // inspect --config: a run's config (with --set overrides) and the ranks it will run on
  std::string config;
  std::vector<std::string> sets;
  int ranks = 1;
};

int RunPrepare(const DataOptions& o) {
  const Tokenizer tokenizer = Tokenizer::Load(o.tokenizer);
  TokenEncoder encoder;
  encoder.encode = [&tokenizer](std::string_view text) { return tokenizer.Encode(text); };
  encoder.vocab_size = tokenizer.vocab_size();
  encoder.eos_id = tokenizer.EndOfTextId(o.eos_token);
  if (encoder.eos_id < 0)
    throw UsageError(o.tokenizer +
                     ": no end-of-text token found by name to close documents; name it with "
                     "--eos-token");
  encoder.checksum = tokenizer.Checksum();
  PrepareOptions options;
  options.inputs = o.inputs;
  options.output_prefix = o.output;
  options.format = o.format;
  options.json_field = o.field;
  options.split = o.split;
  options.progress = !o.quiet;
  const PrepareResult r = PrepareShard(options, encoder);
  PrintLine(
      StrFormat("prepared prefix=%s documents=%lld tokens=%lld dtype=%s input_mb=%.2f "
                "seconds=%.2f mb/s=%.2f skipped_empty=%lld content=%s",
                o.output.c_str(), (long long)r.manifest.documents, (long long)r.manifest.tokens,
                r.manifest.dtype.c_str(), r.input_bytes / 1e6, r.seconds,
                r.input_bytes / 1e6 / std::max(r.seconds, 1e-9), (long long)r.skipped_empty,
                r.manifest.content_checksum.c_str()));
  return kExitOk;
}

BlendOptions MakeBlendOptions(const DataOptions& o, bool progress) {
  BlendOptions b;
  b.file_list = o.list;
  b.seq_len = o.seq_len;
  b.seed = o.seed;
  b.num_samples = o.samples;
  b.samples_from = StrFormat("--samples %lld", (long long)o.samples);
  b.cache_dir = o.cache_dir;
  b.progress = progress;
  if (!o.tokenizer.empty()) {
    const Tokenizer tokenizer = Tokenizer::Load(o.tokenizer);
    b.tokenizer_checksum = tokenizer.Checksum();
    b.vocab_size = tokenizer.vocab_size();
  }
  return b;
}

// Per corpus: samples taken and the worst deviation |taken(n) - n * share| over every prefix n.
struct CorpusMixture {
  double share = 0;
  int64_t taken = 0;
  double worst_prefix_error = 0;
};

std::map<std::string, CorpusMixture> RealisedMixture(const BlendedDataset& blend,
                                                     double* worst_dataset_error) {
  const auto& shards = blend.shards();
  const int64_t n = blend.size();
  // Per dataset the deviation is extreme just before (most negative) and just after (most
  // positive) each of its samples, and at the end: O(N + D).
  std::vector<int64_t> taken(shards.size(), 0);
  std::vector<double> worst(shards.size(), 0);
  std::vector<int> corpus_of(shards.size());
  std::map<std::string, int> corpus_ids;
  for (size_t d = 0; d < shards.size(); ++d)
    corpus_of[d] = corpus_ids.emplace(shards[d].entry.corpus, corpus_ids.size()).first->second;
  std::vector<double> corpus_share(corpus_ids.size(), 0);
  for (size_t d = 0; d < shards.size(); ++d) corpus_share[corpus_of[d]] += shards[d].share;
  std::vector<int64_t> corpus_taken(corpus_ids.size(), 0);
  std::vector<double> corpus_worst(corpus_ids.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const SampleOrigin o = blend.Origin(i);
    const int d = o.dataset, c = corpus_of[d];
    worst[d] = std::max(worst[d], std::abs(taken[d] - i * shards[d].share));
    corpus_worst[c] = std::max(corpus_worst[c], std::abs(corpus_taken[c] - i * corpus_share[c]));
    ++taken[d];
    ++corpus_taken[c];
    worst[d] = std::max(worst[d], std::abs(taken[d] - (i + 1) * shards[d].share));
    corpus_worst[c] =
        std::max(corpus_worst[c], std::abs(corpus_taken[c] - (i + 1) * corpus_share[c]));
  }
  *worst_dataset_error = 0;
  for (size_t d = 0; d < shards.size(); ++d)
    *worst_dataset_error =
        std::max({*worst_dataset_error, worst[d], std::abs(taken[d] - n * shards[d].share)});
  std::map<std::string, CorpusMixture> out;
  for (const auto& [name, c] : corpus_ids)
    out[name] = {corpus_share[c], corpus_taken[c],
                 std::max(corpus_worst[c], std::abs(corpus_taken[c] - n * corpus_share[c]))};
  return out;
}

int RunBlend(const DataOptions& o) {
  Timer timer;
  auto blend = BlendedDataset::Open(MakeBlendOptions(o, !o.quiet));
  double worst = 0;
  auto mixture = RealisedMixture(*blend, &worst);
  for (const auto& [name, m] : mixture)
    PrintLine(StrFormat("corpus=%s weight=%.6f realised=%.6f samples=%lld max_prefix_error=%.3f",
                        name.c_str(), m.share,
                        blend->size() ? m.taken / (double)blend->size() : 0.0, (long long)m.taken,
                        m.worst_prefix_error));
  PrintLine(
      StrFormat("blend datasets=%zu samples=%lld seq_len=%lld seed=%llu "
                "max_prefix_error_per_dataset=%.3f index=%s seconds=%.2f",
                blend->shards().size(), (long long)blend->size(), (long long)o.seq_len,
                (unsigned long long)o.seed, worst, blend->cache_path().c_str(), timer.Seconds()));
  return kExitOk;
}

int RunVerify(const DataOptions& o) {
  std::vector<std::pair<std::string, std::string>> shards;  // (where, prefix)
  if (!o.list.empty())
    for (const auto& e : ReadFileList(o.list)) shards.push_back({e.where, e.prefix});
  for (const auto& p : o.prefixes) {
    std::string prefix = p;
    if (EndsWith(prefix, ".bin") || EndsWith(prefix, ".idx")) prefix.resize(prefix.size() - 4);
    shards.push_back({prefix, prefix});
  }
  if (shards.empty()) throw UsageError("data verify: name shard prefixes or --list FILE");
  int bad = 0;
  for (const auto& [where, prefix] : shards) {
    std::vector<std::string> problems;
    try {
      const ShardManifest m = ReadManifest(prefix);
      problems = VerifyShard(prefix, m);
      if (problems.empty()) IndexedDataset check(prefix);  // structure too
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
    if (problems.empty()) {
      PrintLine("ok " + prefix);
    } else {
      ++bad;
      for (const auto& p : problems)
        std::fprintf(stderr, "crucible: error: %s: %s\n", where.c_str(), p.c_str());
      PrintLine("bad " + prefix);
    }
  }
  PrintLine(StrFormat("verified shards=%zu bad=%d", shards.size(), bad));
  return bad ? kExitBadData : kExitOk;
}

// The realised mixture of every stage of a run's [[data.stages]] (docs/data.md#stages).
void PrintStageMixtures(const BlendedDataset& blend, const std::vector<DataStage>& stages) {
  const std::vector<StageMixtureReport> reports = RealisedStageMixtures(blend);
  double worst = 0, worst_anneal = 0;
  for (size_t k = 0; k < reports.size(); ++k) {
    const StageMixtureReport& r = reports[k];
    const DataStage& stage = stages[k];
    std::printf(
        "\nStage %d \"%s\": steps %lld-%lld, samples %lld-%lld (%lld), %s %s, lr_policy %s\n",
        r.stage, r.name.c_str(), (long long)stage.first_step, (long long)stage.last_step(),
        (long long)r.first_sample, (long long)(r.first_sample + r.samples - 1),
        (long long)r.samples, stage.blends.empty() ? "list" : "blends", stage.list.c_str(),
        LrPolicyName(stage.lr_policy));
    if (r.anneal_samples > 0)
      std::printf(
          "  anneal: its first %lld samples (%lld steps) move from stage %d's weights to these, "
          "per sample; after it, realised and the prefix error count from the anneal's end\n",
          (long long)r.anneal_samples, (long long)stage.anneal_steps, r.stage - 1);
    std::printf("  %-16s %7s %9s %9s %9s %17s %9s %17s\n", "corpus", "dataset", "weight",
                "realised", "samples", "max prefix error", "anneal", "anneal max error");
    const int64_t steady = r.samples - r.anneal_samples;
    for (const StageDatasetMixture& d : r.datasets) {
      std::printf("  %-16s %7d %9.4f %9.4f %9lld %17.3f %9lld %17.3f\n", d.corpus.c_str(),
                  d.dataset, d.weight, steady > 0 ? d.taken / static_cast<double>(steady) : 0.0,
                  (long long)d.taken, d.max_error, (long long)d.anneal_taken, d.anneal_max_error);
      worst = std::max(worst, d.max_error);
      worst_anneal = std::max(worst_anneal, d.anneal_max_error);
    }
  }
  std::printf(
      "\n  worst deviation of any dataset at any prefix of a stage (after its anneal): %.3f "
      "samples; in an anneal, from the interpolated target: %.3f samples\n",
      worst, worst_anneal);
}

// inspect --config: the blend a run's config reads (its stages, or its one file list).
int RunInspectConfig(const DataOptions& o) {
  if (o.ranks < 1) throw UsageError("data inspect: --ranks must be at least 1");
  Config config = Config::Load(o.config, o.sets);
  config.Validate();
  const TrainingConfig training = BuildTrainingConfig(config, o.ranks);
  if (config.String("training.dataset") != "blend")
    throw UsageError(o.config + ": training.dataset = \"" + config.String("training.dataset") +
                     "\" reads no blend; data inspect --config reports a blend or its stages");
  std::unique_ptr<TokenSource> source = MakeTokenSource(
      config, /*vocab_size=*/0, training.shape.seq_len, training.steps, training.batches);
  const auto* blend = dynamic_cast<const BlendedDataset*>(source.get());
  if (!blend) throw Error(kExitFailure, "internal: a blend config made no blend");
  std::printf("Config %s: %zu stage(s), %lld steps, %lld samples of %lld+1 tokens, seed %llu\n",
              o.config.c_str(), training.stages.size(), (long long)training.steps,
              (long long)blend->size(), (long long)training.shape.seq_len,
              (unsigned long long)config.Int("debug.seed"));
  if (training.stages.empty()) {
    double worst = 0;
    for (const auto& [name, m] : RealisedMixture(*blend, &worst))
      std::printf("  %-16s weight %9.4f realised %9.4f samples %9lld max prefix error %9.3f\n",
                  name.c_str(), m.share,
                  blend->size() ? m.taken / static_cast<double>(blend->size()) : 0.0,
                  (long long)m.taken, m.worst_prefix_error);
    return kExitOk;
  }
  PrintStageMixtures(*blend, training.stages);
  return kExitOk;
}

int RunInspect(const DataOptions& o) {
  if (!o.config.empty()) {
    if (!o.list.empty() || o.seq_len > 0 || o.samples > 0)
      throw UsageError(
          "data inspect: --config takes the list, seq_len and samples from the "
          "config; leave out --list, --seq-len and --samples");
    return RunInspectConfig(o);
  }
  if (o.list.empty() || o.seq_len < 1 || o.samples < 1)
    throw UsageError("data inspect: give --list, --seq-len and --samples (or --config RUN.toml)");
  auto blend = BlendedDataset::Open(MakeBlendOptions(o, !o.quiet));
  std::printf("Blend %s: %zu datasets, %lld samples of %lld+1 tokens, seed %llu\n", o.list.c_str(),
              blend->shards().size(), (long long)blend->size(), (long long)o.seq_len,
              (unsigned long long)o.seed);
  std::printf("\nShards (documents end with EOS; lengths in tokens):\n");
  std::printf("  %-28s %-12s %9s %11s %8s %8s %8s %10s\n", "prefix", "corpus", "documents",
              "tokens", "mean", "min", "max", "samples/ep");
  for (const auto& s : blend->shards()) {
    IndexedDataset data(s.entry.prefix);
    int64_t shortest = INT64_MAX, longest = 0;
    for (int64_t i = 0; i < data.sequence_count(); ++i) {
      shortest = std::min(shortest, data.sequence_length(i));
      longest = std::max(longest, data.sequence_length(i));
    }
    std::string name = s.entry.prefix.substr(s.entry.prefix.find_last_of('/') + 1);
    std::printf("  %-28s %-12s %9lld %11lld %8.1f %8lld %8lld %10lld\n", name.c_str(),
                s.entry.corpus.c_str(), (long long)data.sequence_count(),
                (long long)data.total_tokens(),
                data.total_tokens() / std::max<double>(1, data.sequence_count()),
                (long long)shortest, (long long)longest, (long long)s.samples_per_epoch);
  }
  double worst = 0;
  auto mixture = RealisedMixture(*blend, &worst);
  std::printf("\nRealised mixture over %lld samples (weight = normalised share):\n",
              (long long)blend->size());
  std::printf("  %-16s %9s %9s %9s %10s %17s\n", "corpus", "weight", "realised", "samples",
              "epochs", "max prefix error");
  for (const auto& [name, m] : mixture) {
    double corpus_epochs = 0;
    for (const auto& s : blend->shards())
      if (s.entry.corpus == name)
        corpus_epochs =
            std::max(corpus_epochs, m.taken * (s.share / m.share) / s.samples_per_epoch);
    std::printf("  %-16s %9.4f %9.4f %9lld %10.2f %17.3f\n", name.c_str(), m.share,
                blend->size() ? m.taken / (double)blend->size() : 0.0, (long long)m.taken,
                corpus_epochs, m.worst_prefix_error);
  }
  std::printf("  worst deviation of any dataset at any prefix: %.3f samples\n", worst);
  if (o.decode > 0 && blend->size() > 0) {
    std::unique_ptr<Tokenizer> tokenizer;
    if (!o.tokenizer.empty()) tokenizer = std::make_unique<Tokenizer>(Tokenizer::Load(o.tokenizer));
    std::vector<int32_t> tokens(o.seq_len + 1);
    for (int64_t i = 0; i < std::min(o.decode, blend->size()); ++i) {
      blend->Sample(i, tokens.data());
      const SampleOrigin origin = blend->Origin(i);
      std::printf(
          "\nSample %lld (corpus %s, dataset %d, its sample %lld, epoch %lld, window %lld):\n",
          (long long)i, blend->shards()[origin.dataset].entry.corpus.c_str(), origin.dataset,
          (long long)origin.position, (long long)origin.epoch, (long long)origin.window);
      if (tokenizer) {
        std::printf("%s\n",
                    tokenizer->Decode(std::vector<uint32_t>(tokens.begin(), tokens.end())).c_str());
      } else {
        for (int32_t t : tokens) std::printf("%d ", t);
        std::printf("\n");
      }
    }
  }
  return kExitOk;
}

int RunManifest(const DataOptions& o) {
  const Tokenizer tokenizer = Tokenizer::Load(o.tokenizer);
  for (std::string prefix : o.prefixes) {
    if (EndsWith(prefix, ".bin") || EndsWith(prefix, ".idx")) prefix.resize(prefix.size() - 4);
    const ShardManifest m = DescribeShard(prefix, tokenizer.Checksum(), tokenizer.vocab_size(),
                                          tokenizer.EndOfTextId(o.eos_token));
    WriteManifest(prefix, m);
    PrintLine(StrFormat("manifest prefix=%s documents=%lld tokens=%lld dtype=%s content=%s",
                        prefix.c_str(), (long long)m.documents, (long long)m.tokens,
                        m.dtype.c_str(), m.content_checksum.c_str()));
  }
  return kExitOk;
}

int RunDump(const DataOptions& o) {
  if (o.prefixes.size() != 1) throw UsageError("data dump: name one shard prefix");
  std::string prefix = o.prefixes[0];
  if (EndsWith(prefix, ".bin") || EndsWith(prefix, ".idx")) prefix.resize(prefix.size() - 4);
  IndexedDataset data(prefix);
  std::string line;
  for (int64_t s = 0; s < data.sequence_count(); ++s) {
    line = "[";
    for (int64_t t : data.Sequence(s)) line += std::to_string(t) + ",";
    if (line.size() > 1) line.pop_back();
    line += "]\n";
    if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size())
      ThrowErrno("cannot write to stdout");  // stop now, not after the whole shard
  }
  return kExitOk;
}

// Counts may be written in exponent form ("1e11"): such a value becomes the integer it denotes
// (when it is one), so that the size checks name it; anything else goes to the integer parser.
const CLI::Validator kCount(
    [](std::string& value) {
      if (value.find_first_of("eE") == std::string::npos) return std::string();
      char* end = nullptr;
      const double number = std::strtod(value.c_str(), &end);
      if (end != value.c_str() && *end == '\0' && number >= 0 && number < 0x1p63 &&
          std::floor(number) == number)
        value = StrFormat("%.0f", number);
      return std::string();
    },
    "", "COUNT");

// `inspect` takes a run's config instead of --list/--seq-len/--samples (checked when it runs).
void AddBlendOptions(CLI::App* app, DataOptions* o, bool need_samples, bool or_config = false) {
  auto* list = app->add_option("--list", o->list,
                               "blendcorpus file list: `weight prefix [corpus]` per line");
  auto* seq_len =
      app->add_option("--seq-len", o->seq_len, "tokens per sample (each sample holds seq_len + 1)")
          ->transform(kCount);
  if (!or_config) {
    list->required();
    seq_len->required();
  }
  auto* samples =
      app->add_option("--samples", o->samples,
                      "global samples to index (1e6 or 1000000; 10 bytes of index each, refused "
                      "when twice that exceeds the memory this process can have)")
          ->transform(kCount);
  if (need_samples && !or_config) samples->required();
  app->add_option("--seed", o->seed, "shuffle seed (the [debug] seed of a run)");
  app->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json: its checksum must match the shards' (and decodes samples)");
  app->add_option("--cache-dir", o->cache_dir,
                  "blend index cache (default: <list folder>/.crucible-cache)");
  app->add_flag("-q,--quiet", o->quiet, "no phase= lines");
}

CommandRun SetupData(CLI::App& app) {
  auto o = std::make_shared<DataOptions>();
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 ok, 2 usage, 65 bad data (named file and line), 74 I/O. See docs/data.md.");
  CLI::App* prepare =
      app.add_subcommand("prepare", "text/jsonl files -> Megatron .bin/.idx shard + manifest");
  prepare
      ->add_option("inputs", o->inputs,
                   "input files (.jsonl/.json: one JSON document per line; else text)")
      ->required();
  prepare
      ->add_option("-o,--output", o->output,
                   "output prefix (writes PREFIX.bin, .idx, .manifest.json)")
      ->required();
  prepare->add_option("-t,--tokenizer", o->tokenizer, "tokenizer.json (byte-level BPE)")
      ->required();
  prepare->add_option("--field", o->field, "jsonl: field holding the text (default text)");
  prepare->add_option("--format", o->format, "auto (by extension), text or jsonl");
  prepare->add_option("--split", o->split,
                      "text: a document is a file, paragraph (blank-line separated) or line");
  prepare->add_option("--eos-token", o->eos_token,
                      "the token that closes each document (default: the tokenizer's "
                      "end-of-text token, found by name, e.g. <|end_of_text|>)");
  prepare->add_flag("-q,--quiet", o->quiet, "no progress lines");
  CLI::App* blend = app.add_subcommand(
      "blend", "build (or reuse) the cached blend index of a file list and report its mixture");
  AddBlendOptions(blend, o.get(), true);
  CLI::App* verify =
      app.add_subcommand("verify", "re-hash shards and compare with their manifests");
  verify->add_option("prefixes", o->prefixes, "shard prefixes");
  verify->add_option("--list", o->list, "verify every shard of a file list");
  CLI::App* inspect = app.add_subcommand(
      "inspect", "realised mixture vs weights, document/token statistics, decoded samples");
  AddBlendOptions(inspect, o.get(), true, /*or_config=*/true);
  inspect
      ->add_option("--decode", o->decode, "samples to print (decoded with --tokenizer, else ids)")
      ->transform(kCount);
  inspect->add_option("--config", o->config,
                      "a run's config: the realised mixture of each of its [[data.stages]] (or "
                      "of its blend), for the run's steps, batches and seed");
  inspect->add_option("--set", o->sets, "config override section.key=value (with --config)");
  inspect->add_option("--ranks", o->ranks,
                      "the ranks the run will use (with --config; for global_batch_size = 0)");
  CLI::App* dump = app.add_subcommand(
      "dump",
      "print every sequence of a .bin/.idx shard (any Megatron shard) as a JSON array of ids");
  dump->add_option("prefix", o->prefixes, "shard prefix")->required();
  CLI::App* manifest = app.add_subcommand("manifest",
                                          "write the manifest of an existing .bin/.idx shard (e.g. "
                                          "made by Megatron) so it can be blended");
  manifest->add_option("prefixes", o->prefixes, "shard prefixes")->required();
  manifest->add_option("-t,--tokenizer", o->tokenizer, "tokenizer.json the shard was made with")
      ->required();
  manifest->add_option("--eos-token", o->eos_token,
                       "the token that closes its documents (default: found by name)");
  return [o, prepare, blend, verify, inspect, dump, manifest]() {
    if (dump->parsed()) return RunDump(*o);
    if (manifest->parsed()) return RunManifest(*o);
    if (prepare->parsed()) return RunPrepare(*o);
    if (blend->parsed()) return RunBlend(*o);
    if (verify->parsed()) return RunVerify(*o);
    if (inspect->parsed()) return RunInspect(*o);
    return static_cast<int>(kExitUsage);
  };
}

CommandRegistrar data_registrar("data", "data pipeline: prepare, blend, verify, inspect",
                                SetupData);

}  // namespace
}  // namespace crucible
