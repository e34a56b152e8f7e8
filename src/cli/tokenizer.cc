// crucible tokenizer train|encode|decode|info: BPE tokenizers (byte-level; SentencePiece-style
// to encode and decode) as Hugging Face tokenizer.json files (see docs/tokenizer.md).
#include "tokenizer/tokenizer.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "common/lines.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {
namespace {

constexpr size_t kBatchBytes = 64 << 20;  // documents are read and encoded 64 MiB at a time

struct TokenizerOptions {
  std::string tokenizer_path, out, out_bin, in_bin, format = "auto", field = "text";
  std::string pretokenizer = "llama3", eos_token;
  std::vector<std::string> inputs;
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"};
  int64_t vocab_size = 8192, min_frequency = 2;
  int threads = 0;
  bool whole_file = false, eos = false, pieces = false, jsonl_out = false, skip_special = false,
       all_special = false;
};

// Reads documents from text files (one per line, or one per file) and jsonl files (one object
// per line, the string at `field`), a batch at a time, with the one line splitter
// (common/lines.h: CRLF reads as LF). Errors name the file and line.
class DocumentReader {
 public:
  DocumentReader(const TokenizerOptions& o) : o_(o) {}

  // Fills *documents with the next batch (views into internal buffers valid until the next
  // call); false when every input is done.
  bool Next(std::vector<std::string_view>* documents) {
    documents->clear();
    strings_.clear();
    while (documents->empty()) {
      if (!fd_open_ && !OpenNext()) return false;
      if (!ReadBlock()) continue;
      if (whole_file_) {  // as data prepare --split file reads a file
        buffer_ = JoinLines(buffer_);
        documents->push_back(buffer_);
        continue;
      }
      std::vector<std::string_view> lines;
      LineSplitter splitter(buffer_);
      for (std::string_view line; splitter.Next(&line);) lines.push_back(line);
      if (!jsonl_) {
        *documents = std::move(lines);
      } else {
        ParseJsonl(lines, documents);
      }
      first_line_ += lines.size();
    }
    return true;
  }

 private:
  bool OpenNext() {
    if (next_input_ >= o_.inputs.size()) return false;
    path_ = o_.inputs[next_input_++];
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (!FileExists(path_)) throw UsageError(path_ + ": no such file");
      ThrowErrno("cannot open " + path_);
    }
    fd_open_ = true;
    carry_.clear();
    first_line_ = 1;
    jsonl_ = o_.format == "jsonl" ||
             (o_.format == "auto" && (EndsWith(path_, ".jsonl") || EndsWith(path_, ".json")));
    whole_file_ = o_.whole_file && !jsonl_;
    return true;
  }

  // Reads up to kBatchBytes of whole lines, each with its line end (or the whole file), into
  // buffer_; false at EOF.
  bool ReadBlock() {
    buffer_ = std::move(carry_);
    carry_.clear();
    bool eof = false;
    std::vector<char> chunk(1 << 20);
    for (size_t target = kBatchBytes;; target += kBatchBytes) {
      while (whole_file_ || buffer_.size() < target) {
        ssize_t n = ::read(fd_, chunk.data(), chunk.size());
        if (n < 0) {
          if (errno == EINTR) continue;
          ThrowErrno("cannot read " + path_);
        }
        if (n == 0) {
          eof = true;
          break;
        }
        buffer_.append(chunk.data(), static_cast<size_t>(n));
      }
      // Stop at the end of the file or once the block holds a whole line; a line longer than a
      // batch makes the block grow until it ends.
      if (eof ||
          buffer_.find('\n', target > kBatchBytes ? target - kBatchBytes : 0) != std::string::npos)
        break;
    }
    if (eof) {
      ::close(fd_);
      fd_open_ = false;
      return !buffer_.empty() || whole_file_;
    }
    size_t last = buffer_.rfind('\n');
    carry_ = buffer_.substr(last + 1);
    buffer_.resize(last + 1);
    return true;
  }

  void ParseJsonl(const std::vector<std::string_view>& lines,
                  std::vector<std::string_view>* documents) {
    strings_.assign(lines.size(), std::string());
    std::vector<char> present(lines.size(), 0);
    std::vector<std::string> errors(lines.size());
#pragma omp parallel for schedule(dynamic, 256)
    for (size_t i = 0; i < lines.size(); ++i) {
      if (Trim(lines[i]).empty()) continue;
      try {
        nlohmann::json object = nlohmann::json::parse(lines[i]);
        auto it = object.find(o_.field);
        if (!object.is_object() || it == object.end() || !it->is_string())
          errors[i] = "no string field \"" + o_.field + "\"";
        else {
          strings_[i] = it->get<std::string>();
          present[i] = 1;
        }
      } catch (const nlohmann::json::exception& e) {
        errors[i] = std::string("not valid JSON (") + e.what() + ")";
      }
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!errors[i].empty())
        throw DataError(path_ + ":" + std::to_string(first_line_ + i) + ": " + errors[i]);
      if (present[i]) documents->push_back(strings_[i]);
    }
  }

  const TokenizerOptions& o_;
  size_t next_input_ = 0;
  std::string path_, buffer_, carry_;
  std::vector<std::string> strings_;
  int fd_ = -1;
  bool fd_open_ = false, jsonl_ = false, whole_file_ = false;
  size_t first_line_ = 1;
};

// The output of encode or decode: a file written by the policy of common/files.h (replaced
// atomically by Commit(), or written through to a device or FIFO), or stdout when the path is
// empty or "-". Buffered: the writes come a document at a time.
class CommandOutput {
 public:
  explicit CommandOutput(const std::string& path) {
    if (path.empty() || path == "-") return;
    const std::string parent = ParentDirectory(path);
    if (!parent.empty()) MakeDirectories(parent);
    file_.emplace(path);
  }
  void Write(const void* data, size_t size) {
    if (!file_) {  // through stdio's buffer, in order with the lines printed beside it
      if (size && std::fwrite(data, 1, size, stdout) != size) ThrowErrno("cannot write to stdout");
      return;
    }
    buffer_.append(static_cast<const char*>(data), size);
    if (buffer_.size() >= (1u << 20)) Flush();
  }
  void Commit() {
    if (!file_) {
      if (std::fflush(stdout) != 0) ThrowErrno("cannot write to stdout");
      return;
    }
    Flush();
    file_->Commit();
  }

 private:
  void Flush() {
    file_->Write(buffer_);
    buffer_.clear();
  }
  std::optional<OutputFile> file_;
  std::string buffer_;
};

void AppendIds(const std::vector<uint32_t>& ids, std::string* out) {
  char number[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out->push_back(' ');
    auto result = std::to_chars(number, number + sizeof(number), ids[i]);
    out->append(number, result.ptr);
  }
  out->push_back('\n');
}

int RunTrain(const TokenizerOptions& o) {
  if (o.out.empty()) throw UsageError("tokenizer train: --out is required");
  TokenizerTrainOptions train;
  train.vocab_size = o.vocab_size;
  train.special_tokens = o.special_tokens;
  train.pretokenizer = o.pretokenizer;
  train.min_frequency = o.min_frequency;
  train.threads = o.threads;
  TokenizerTrainer trainer(train);
  DocumentReader reader(o);
  std::vector<std::string_view> documents;
  Timer timer;
  double bytes = 0;
  while (reader.Next(&documents)) {
    for (auto d : documents) bytes += static_cast<double>(d.size());
    trainer.AddDocuments(documents);
    PrintLine(StrFormat("phase=count documents=%lld bytes=%.0f unique_words=%lld",
                        (long long)trainer.documents(), bytes, (long long)trainer.unique_words()));
  }
  if (trainer.documents() == 0) throw DataError("tokenizer train: the input holds no documents");
  Tokenizer tokenizer = trainer.Train([](int64_t done, int64_t target) {
    static Timer heartbeat;
    if (done < target && heartbeat.Seconds() < 2.0) return;
    heartbeat.Reset();
    PrintLine(StrFormat("phase=merge merges=%lld target=%lld", (long long)done, (long long)target));
  });
  tokenizer.Save(o.out);
  PrintLine(
      StrFormat("trained vocab_size=%lld merges=%lld documents=%lld bytes=%.0f seconds=%.2f "
                "checksum=%s out=%s",
                (long long)tokenizer.vocab_size(), (long long)tokenizer.merges_count(),
                (long long)trainer.documents(), bytes, timer.Seconds(),
                tokenizer.Checksum().c_str(), o.out.c_str()));
  if (tokenizer.vocab_size() < o.vocab_size)
    LogWarn(StrFormat("vocab_size %lld is below the requested %lld: no pair occurs %lld times more",
                      (long long)tokenizer.vocab_size(), (long long)o.vocab_size,
                      (long long)o.min_frequency));
  return 0;
}

int RunEncode(const TokenizerOptions& o) {
  Tokenizer tokenizer = Tokenizer::Load(o.tokenizer_path);
  const bool eos = o.eos || !o.eos_token.empty();
  const int64_t eos_id = tokenizer.EndOfTextId(o.eos_token);
  if (eos && eos_id < 0)
    throw UsageError(o.tokenizer_path +
                     ": --eos given but the tokenizer has no end-of-text token (name one with "
                     "--eos-token)");
  const bool binary = !o.out_bin.empty();
  CommandOutput out(binary ? o.out_bin : o.out);
  DocumentReader reader(o);
  std::vector<std::string_view> documents;
  Timer total;
  double bytes = 0, encode_seconds = 0;
  int64_t tokens = 0, count = 0;
  std::string text;
  while (o.pieces && reader.Next(&documents)) {  // debugging: pre-tokens as JSON lists
    for (auto d : documents) {
      std::string line = nlohmann::json(tokenizer.PreTokenize(d))
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      line.push_back('\n');
      out.Write(line.data(), line.size());
      bytes += static_cast<double>(d.size());
    }
    count += static_cast<int64_t>(documents.size());
  }
  while (!o.pieces && reader.Next(&documents)) {
    Timer timer;
    auto encoded = tokenizer.EncodeBatch(documents, o.threads);
    encode_seconds += timer.Seconds();
    for (auto d : documents) bytes += static_cast<double>(d.size());
    for (auto& ids : encoded) {
      if (eos) ids.push_back(static_cast<uint32_t>(eos_id));
      tokens += static_cast<int64_t>(ids.size());
      if (binary) {
        out.Write(ids.data(), ids.size() * sizeof(uint32_t));
      } else {
        AppendIds(ids, &text);
        if (text.size() > (1 << 20)) {
          out.Write(text.data(), text.size());
          text.clear();
        }
      }
    }
    count += static_cast<int64_t>(documents.size());
    // A heartbeat per batch (64 MiB); on stderr, since stdout may be carrying the ids.
    LogInfo(StrFormat("phase=encode documents=%lld MB=%.1f tokens=%lld MB/s=%.1f", (long long)count,
                      bytes / 1e6, (long long)tokens,
                      bytes / 1e6 / std::max(total.Seconds(), 1e-9)));
  }
  out.Write(text.data(), text.size());
  out.Commit();
  LogInfo(StrFormat(
      "encoded documents=%lld bytes=%.0f tokens=%lld seconds=%.3f encode_MB/s=%.1f "
      "total_MB/s=%.1f threads=%d",
      (long long)count, bytes, (long long)tokens, total.Seconds(),
      bytes / 1e6 / std::max(encode_seconds, 1e-9), bytes / 1e6 / std::max(total.Seconds(), 1e-9),
      o.threads > 0 ? o.threads : omp_get_max_threads()));
  return 0;
}

int RunDecode(const TokenizerOptions& o) {
  Tokenizer tokenizer = Tokenizer::Load(o.tokenizer_path);
  CommandOutput out(o.out);
  auto emit = [&](const std::vector<uint32_t>& ids) {
    std::string decoded = tokenizer.Decode(ids, o.skip_special);
    if (o.jsonl_out) decoded = nlohmann::json({{o.field, decoded}}).dump();
    decoded.push_back('\n');
    out.Write(decoded.data(), decoded.size());
  };
  if (!o.in_bin.empty()) {
    std::string data = ReadFile(o.in_bin);
    if (data.size() % sizeof(uint32_t) != 0)
      throw DataError(o.in_bin + ": size " + std::to_string(data.size()) +
                      " is not a multiple of 4 (raw uint32 ids expected)");
    std::vector<uint32_t> ids(data.size() / sizeof(uint32_t));
    std::memcpy(ids.data(), data.data(), data.size());
    emit(ids);
  } else {
    if (o.inputs.empty()) throw UsageError("tokenizer decode: give an ids file or --in-bin");
    for (const std::string& path : o.inputs) {
      std::string data = ReadFile(path);
      LineSplitter lines(data);
      for (std::string_view text; lines.Next(&text);) {
        const size_t line = lines.line_number();
        std::vector<uint32_t> ids;
        const char* p = text.data();
        const char* stop = text.data() + text.size();
        while (p < stop) {
          while (p < stop && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
          if (p == stop) break;
          uint32_t id;
          auto result = std::from_chars(p, stop, id);
          if (result.ec != std::errc())
            throw DataError(path + ":" + std::to_string(line) + ": not a token id: '" +
                            std::string(p, std::min<size_t>(16, stop - p)) + "'");
          if (id >= tokenizer.vocab_size())
            throw DataError(path + ":" + std::to_string(line) + ": id " + std::to_string(id) +
                            " is outside the vocabulary (size " +
                            std::to_string(tokenizer.vocab_size()) + ")");
          ids.push_back(id);
          p = result.ptr;
        }
        emit(ids);
      }
    }
  }
  out.Commit();
  return 0;
}

// A token as one line shows it: as written, or JSON-quoted when it holds a control character.
std::string ShowToken(const std::string& content) {
  for (unsigned char c : content)
    if (c < 0x20 || c == 0x7F) return nlohmann::json(content).dump();
  return content;
}

constexpr size_t kListedSpecialTokens = 16;  // tokenizer info lists this many unless --all

int RunInfo(const TokenizerOptions& o) {
  Tokenizer tokenizer = Tokenizer::Load(o.tokenizer_path);
  const int64_t eos = tokenizer.EndOfTextId(o.eos_token), bos = tokenizer.bos_id();
  const auto specials = tokenizer.SpecialTokens();
  std::string text = StrFormat(
      "path=%s\nmodel=%s\nvocab_size=%lld\nmerges=%lld\nspecial_tokens=%zu\n",
      o.tokenizer_path.c_str(), tokenizer.Describe().c_str(), (long long)tokenizer.vocab_size(),
      (long long)tokenizer.merges_count(), specials.size());
  const size_t listed =
      o.all_special ? specials.size() : std::min(specials.size(), kListedSpecialTokens);
  for (size_t i = 0; i < listed; ++i)
    text += "special_token=" + ShowToken(specials[i].first) + ":" +
            std::to_string(specials[i].second) + "\n";
  if (listed < specials.size())
    text +=
        StrFormat("special_tokens_not_listed=%zu (--all lists them)\n", specials.size() - listed);
  auto token = [&](int64_t id) {
    return id < 0 ? std::string() : ShowToken(tokenizer.IdToToken(static_cast<uint32_t>(id)));
  };
  text += StrFormat("bos_id=%lld\nbos_token=%s\neos_id=%lld\neos_token=%s\nchecksum=%s\n",
                    (long long)bos, token(bos).c_str(), (long long)eos, token(eos).c_str(),
                    tokenizer.Checksum().c_str());
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

void AddInputOptions(CLI::App* app, TokenizerOptions* o) {
  app->add_option("--format", o->format,
                  "input format: auto (.jsonl/.json are jsonl, the rest text), text, jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  app->add_option("--field", o->field, "jsonl: the string field that holds the document");
  app->add_flag("--whole-file", o->whole_file,
                "text: each file is one document (default: each line is one)");
  app->add_option("--threads", o->threads, "OpenMP threads (default: all)");
}

CommandRun SetupTokenizer(CLI::App& app) {
  auto o = std::make_shared<TokenizerOptions>();
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 done, 2 usage error, 65 bad data (malformed tokenizer.json or input), "
      "74 I/O error. See docs/tokenizer.md.");

  CLI::App* train = app.add_subcommand(
      "train", "train a byte-level BPE on text/jsonl and write a Hugging Face tokenizer.json");
  train->add_option("inputs", o->inputs, "text or jsonl files")->required();
  train->add_option("-o,--out", o->out, "output tokenizer.json (written atomically)")->required();
  train->add_option("--vocab-size", o->vocab_size, "vocabulary size, special tokens included")
      ->capture_default_str();
  train->add_option("--pretokenizer", o->pretokenizer, "pre-tokenization: llama3 or gpt2")
      ->check(CLI::IsMember({"llama3", "gpt2"}))
      ->capture_default_str();
  train->add_option("--special", o->special_tokens, "special tokens, in id order")
      ->capture_default_str();
  train->add_option("--min-frequency", o->min_frequency, "never merge a pair seen fewer times")
      ->capture_default_str();
  AddInputOptions(train, o.get());

  CLI::App* encode =
      app.add_subcommand("encode", "text/jsonl -> token ids (one line of ids per document)");
  encode->add_option("-t,--tokenizer", o->tokenizer_path, "tokenizer.json")->required();
  encode->add_option("inputs", o->inputs, "text or jsonl files")->required();
  encode->add_option("-o,--out", o->out, "ids as text, one line per document (default: stdout)");
  encode->add_option("--out-bin", o->out_bin, "ids as raw little-endian uint32 instead");
  encode->add_flag("--eos", o->eos, "append the end-of-text id after each document");
  encode->add_option("--eos-token", o->eos_token,
                     "the token --eos appends (default: the tokenizer's end-of-text token, e.g. "
                     "<|end_of_text|>); implies --eos");
  encode->add_flag("--pieces", o->pieces,
                   "debug: write each document's pre-tokens (and added tokens) as a JSON list");
  AddInputOptions(encode, o.get());

  CLI::App* decode = app.add_subcommand("decode", "token ids -> text (one line per document)");
  decode->add_option("-t,--tokenizer", o->tokenizer_path, "tokenizer.json")->required();
  decode->add_option("inputs", o->inputs, "files of ids, one document per line");
  decode->add_option("--in-bin", o->in_bin, "a raw uint32 ids file (decoded as one document)");
  decode->add_option("-o,--out", o->out, "output file (default: stdout)");
  decode->add_flag("--jsonl", o->jsonl_out, "write {\"<field>\": text} lines (keeps newlines)");
  decode->add_option("--field", o->field, "field name for --jsonl");
  decode->add_flag("--skip-special", o->skip_special, "leave special tokens out");

  CLI::App* info = app.add_subcommand(
      "info",
      "print vocab size, special tokens (one per line), BOS/EOS, checksum and model type of a "
      "tokenizer.json");
  info->add_option("tokenizer", o->tokenizer_path, "tokenizer.json")->required();
  info->add_option("--eos-token", o->eos_token,
                   "the end-of-text token to report (default: found by name)");
  info->add_flag("--all", o->all_special,
                 "list every special token (default: the first 16 and a count)");

  return [o, train, encode, decode, info]() {
    if (train->parsed()) return RunTrain(*o);
    if (encode->parsed()) return RunEncode(*o);
    if (decode->parsed()) return RunDecode(*o);
    if (info->parsed()) return RunInfo(*o);
    return static_cast<int>(kExitUsage);
  };
}

CommandRegistrar tokenizer_registrar("tokenizer", "train, encode, decode, inspect BPE tokenizers",
                                     SetupTokenizer);

}  // namespace
}  // namespace crucible
