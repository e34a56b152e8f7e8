#include "data/prepare.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/lines.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "data/indexed_dataset.h"

namespace crucible {
namespace {

// Reads a file line by line (the one line splitter, common/lines.h: CRLF reads as LF) in large
// chunks, hashing every byte on the way.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) throw DataError(path + ": input file not found");
      ThrowErrno("cannot open " + path);
    }
  }
  ~LineReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Next line without its line end; false at the end of the file.
  bool Next(std::string* line) {
    std::string_view view;
    while (!lines_.Next(&view)) {
      if (eof_) return false;
      Fill();
    }
    line->assign(view);
    ++line_number_;
    return true;
  }
  int64_t line_number() const { return line_number_; }
  int64_t bytes_read() const { return bytes_read_; }
  std::string checksum() const { return hasher_.HexDigest128(); }

 private:
  // Reads the next chunk; the splitter gets every complete line held (all of them at the end).
  void Fill() {
    buffer_.erase(0, complete_);
    const size_t held = buffer_.size();
    buffer_.resize(held + (1 << 22));
    ssize_t n;
    do n = ::read(fd_, buffer_.data() + held, buffer_.size() - held);
    while (n < 0 && errno == EINTR);
    if (n < 0) ThrowErrno("cannot read " + path_);
    buffer_.resize(held + static_cast<size_t>(n));
    hasher_.Update(buffer_.data() + held, static_cast<size_t>(n));
    bytes_read_ += n;
    eof_ = n == 0;
    // The held part has no line end (it followed the last one), so look in the new bytes only.
    const size_t last = std::string_view(buffer_).substr(held).rfind('\n');
    complete_ = eof_ ? buffer_.size() : last == std::string_view::npos ? 0 : held + last + 1;
    lines_ = LineSplitter(std::string_view(buffer_).substr(0, complete_));
  }
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  size_t complete_ = 0;  // buffer_[0, complete_) is whole lines, handed to lines_
  LineSplitter lines_{std::string_view()};
  bool eof_ = false;
  int64_t line_number_ = 0, bytes_read_ = 0;
  StreamHasher hasher_;
};

struct Document {
  std::string text;
  std::string where;  // "file:line" for error messages
};

// Produces the documents of one input file in order.
class DocumentReader {
 public:
  DocumentReader(const std::string& path, const PrepareOptions& options)
      : path_(path), reader_(path), field_(options.json_field) {
    std::string format = options.format;
    if (format == "auto")
      format = (EndsWith(path, ".jsonl") || EndsWith(path, ".json")) ? "jsonl" : "text";
    if (format == "jsonl") {
      mode_ = kJsonl;
    } else if (format == "text") {
      if (options.split == "file")
        mode_ = kFile;
      else if (options.split == "paragraph")
        mode_ = kParagraph;
      else if (options.split == "line")
        mode_ = kLine;
      else
        throw UsageError("--split: expected file, paragraph or line, got '" + options.split + "'");
    } else {
      throw UsageError("--format: expected auto, text or jsonl, got '" + options.format + "'");
    }
  }

  bool Next(Document* doc) {
    doc->text.clear();
    std::string& line = line_;
    switch (mode_) {
      case kJsonl:
        while (reader_.Next(&line)) {
          if (Trim(line).empty()) continue;
          doc->where = path_ + ":" + std::to_string(reader_.line_number());
          nlohmann::json j;
          try {
            j = nlohmann::json::parse(line);
          } catch (const nlohmann::json::exception& e) {
            throw DataError(doc->where + ": not valid JSON: " + e.what());
          }
          if (!j.is_object() || !j.contains(field_))
            throw DataError(doc->where + ": no field '" + field_ + "' (choose it with --field)");
          if (!j[field_].is_string())
            throw DataError(doc->where + ": field '" + field_ + "' is not a string");
          doc->text = j[field_].get<std::string>();
          return true;
        }
        return false;
      case kLine:
        while (reader_.Next(&line)) {
          if (Trim(line).empty()) continue;
          doc->where = path_ + ":" + std::to_string(reader_.line_number());
          doc->text = line;
          return true;
        }
        return false;
      case kParagraph: {
        bool any = false;
        while (reader_.Next(&line)) {
          if (Trim(line).empty()) {
            if (any) return true;
            continue;
          }
          if (!any) doc->where = path_ + ":" + std::to_string(reader_.line_number());
          if (any) doc->text += '\n';
          doc->text += line;
          any = true;
        }
        return any;
      }
      case kFile: {
        if (file_done_) return false;
        file_done_ = true;
        doc->where = path_;
        bool first = true;
        while (reader_.Next(&line)) {
          if (!first) doc->text += '\n';
          doc->text += line;
          first = false;
        }
        return true;
      }
    }
    return false;
  }
  const LineReader& reader() const { return reader_; }

 private:
  enum Mode { kJsonl, kLine, kParagraph, kFile };
  std::string path_;
  LineReader reader_;
  std::string field_;
  Mode mode_ = kJsonl;
  bool file_done_ = false;
  std::string line_;
};

}  // namespace

PrepareResult PrepareShard(const PrepareOptions& options, const TokenEncoder& encoder) {
  Timer timer;
  if (options.inputs.empty()) throw UsageError("data prepare: name at least one input file");
  if (options.output_prefix.empty()) throw UsageError("data prepare: --output PREFIX is required");
  if (encoder.eos_id < 0)
    throw UsageError(
        "data prepare: the tokenizer has no end-of-text token to close documents (name one "
        "with --eos-token)");
  int64_t total_bytes = 0;
  for (const auto& input : options.inputs) {
    if (!FileExists(input)) throw DataError(input + ": input file not found");
    std::error_code error;
    const auto size = std::filesystem::file_size(input, error);
    total_bytes += error ? 0 : static_cast<int64_t>(size);
  }
  const std::string& prefix = options.output_prefix;
  MakeDirectories(ParentDirectory(prefix));
  // The old shard under this prefix stops looking complete before anything new lands.
  if (FileExists(ManifestPath(prefix)) && ::unlink(ManifestPath(prefix).c_str()) != 0)
    ThrowErrno("cannot remove the old " + ManifestPath(prefix));

  const TokenDtype dtype = OptimalDtype(encoder.vocab_size);
  IndexedDatasetWriter writer(prefix, dtype);
  PrepareResult result;
  ShardManifest& manifest = result.manifest;
  const bool bar = options.progress && ::isatty(2);
  Timer since_report;
  int64_t done_bytes = 0;
  auto report = [&](const std::string& input, bool final) {
    if (!options.progress) return;
    const double seconds = std::max(timer.Seconds(), 1e-9);
    const double mb = static_cast<double>(done_bytes) / 1e6;
    PrintLine(StrFormat(
        "phase=prepare input=%s mb=%.1f total_mb=%.1f mb/s=%.2f documents=%lld "
        "tokens=%lld%s",
        input.c_str(), mb, static_cast<double>(total_bytes) / 1e6, mb / seconds,
        (long long)writer.documents(), (long long)writer.tokens(), final ? " status=encoded" : ""));
    if (bar) {
      const double fraction = total_bytes > 0 ? std::min(1.0, done_bytes / (double)total_bytes) : 1;
      const int filled = static_cast<int>(fraction * 30);
      std::fprintf(stderr, "\r[%s%s] %5.1f%% %.1f MB/s%s", std::string(filled, '#').c_str(),
                   std::string(30 - filled, ' ').c_str(), 100 * fraction, mb / seconds,
                   final ? "\n" : "");
      std::fflush(stderr);
    }
  };

  const int threads = std::max(1, omp_get_max_threads());
  const size_t batch_bytes = 4u << 20;
  std::vector<Document> batch;
  std::vector<std::vector<uint32_t>> encoded;
  std::vector<std::string> errors;
  for (const auto& input : options.inputs) {
    DocumentReader reader(input, options);
    int64_t input_base = done_bytes;
    bool more = true;
    while (more) {
      // Read a batch of documents (a few MB), encode it on every thread, append in order.
      batch.clear();
      size_t bytes = 0;
      while (bytes < batch_bytes && batch.size() < static_cast<size_t>(4096 * threads)) {
        batch.emplace_back();
        if (!reader.Next(&batch.back())) {
          batch.pop_back();
          more = false;
          break;
        }
        bytes += batch.back().text.size();
      }
      encoded.assign(batch.size(), {});
      errors.assign(batch.size(), {});
#pragma omp parallel for schedule(dynamic, 1)
      for (size_t i = 0; i < batch.size(); ++i) {
        try {
          encoded[i] = encoder.encode(batch[i].text);
        } catch (const std::exception& e) {
          errors[i] = batch[i].where + ": cannot encode: " + e.what();
        }
      }
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!errors[i].empty()) throw DataError(errors[i]);
        std::vector<uint32_t>& tokens = encoded[i];
        if (tokens.empty()) {
          ++result.skipped_empty;
          continue;
        }
        for (uint32_t t : tokens)
          if (static_cast<int64_t>(t) >= encoder.vocab_size)
            throw DataError(
                StrFormat("%s: token id %u is outside the tokenizer's vocabulary of %lld "
                          "(vocabulary overflow)",
                          batch[i].where.c_str(), t, (long long)encoder.vocab_size));
        tokens.push_back(static_cast<uint32_t>(encoder.eos_id));
        for (uint32_t t : tokens) manifest.max_token = std::max<int64_t>(manifest.max_token, t);
        writer.AddDocument(tokens.data(), tokens.size(), batch[i].where);
      }
      done_bytes = input_base + reader.reader().bytes_read();
      if (since_report.Seconds() >= 1.0) {
        report(input, false);
        since_report.Reset();
      }
    }
    manifest.sources.push_back({input, reader.reader().bytes_read(), reader.reader().checksum()});
    result.input_bytes += reader.reader().bytes_read();
  }
  report(options.inputs.back(), true);
  if (writer.documents() == 0)
    throw DataError(
        StrFormat("%s: empty corpus: no non-empty documents in %zu input file(s)%s",
                  options.inputs.front().c_str(), options.inputs.size(),
                  result.skipped_empty ? " (every document encoded to no tokens)" : ""));
  writer.Commit();
  const std::string base = prefix.substr(prefix.find_last_of('/') + 1);
  manifest.bin = {base + ".bin", writer.bin_bytes(), writer.bin_checksum()};
  manifest.idx = {base + ".idx", writer.idx_bytes(), writer.idx_checksum()};
  manifest.content_checksum = ContentChecksum(manifest.bin.xxh3_128, manifest.idx.xxh3_128);
  manifest.dtype = DtypeName(dtype);
  manifest.documents = writer.documents();
  manifest.tokens = writer.tokens();
  manifest.tokenizer_checksum = encoder.checksum;
  manifest.vocab_size = encoder.vocab_size;
  manifest.eos_id = encoder.eos_id;
  WriteManifest(prefix, manifest);
  result.seconds = timer.Seconds();
  return result;
}

}  // namespace crucible
