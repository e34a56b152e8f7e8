// File helpers. Everything a command writes goes through OutputFile (AtomicWriteFile for a
// whole buffer): a regular file is written under a temporary name in the same folder, fsynced,
// then renamed over the target, so a reader sees either the old file or the complete new one,
// never a partial write. A special file is never replaced: a character device or a FIFO
// (/dev/null, a terminal, a named pipe) is written straight through, and any other kind (a
// directory, a block device, a socket) is refused with exit 2.
//
// Everything read whole goes through ReadFile, which takes regular files only (a FIFO or a
// device may never end), and a config-like input through ReadConfigFile, which also caps its size.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace crucible {

// The most bytes ReadConfigFile reads: TOML configs, JSON records, file lists, host lists,
// goldens, tokenizers (the largest Hugging Face tokenizer.json files are about 35 MB).
inline constexpr size_t kConfigFileMaxBytes = size_t{64} << 20;  // 64 MiB

// Reads a whole regular file. Throws UsageError when it is missing, behind a symlink loop or not
// a regular file (a directory, a FIFO, a device), IoError when it cannot be read.
std::string ReadFile(const std::string& path);
// ReadFile for a config-like input; also refuses one larger than kConfigFileMaxBytes
// (UsageError naming the file and the cap).
std::string ReadConfigFile(const std::string& path);
bool FileExists(const std::string& path);
// Why stat(path) fails: "" when it does not, "no such file", "a symlink loop (ELOOP)", or the
// system's words for the error.
std::string StatFailure(const std::string& path);
bool IsDirectory(const std::string& path);
void MakeDirectories(const std::string& path);  // mkdir -p; throws IoError

// One file being written, by the policy at the top of this header. A symlink is followed: the
// file it names is replaced (in its own folder) or written through, the link stays.
class OutputFile {
 public:
  // Opens the temporary, or the special file itself. Throws UsageError for a target that is
  // neither a regular file nor a character device or FIFO, IoError when it cannot be opened.
  explicit OutputFile(const std::string& path);
  // Removes the temporary of a file never committed (the target is untouched).
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void Write(const void* data, size_t size);  // throws IoError naming the target
  void Write(std::string_view data) { Write(data.data(), data.size()); }
  // Regular file: fsync, rename over the target, fsync the folder. Special file: close it.
  void Commit();
  // Whether the bytes go straight to a character device or FIFO (nothing is renamed).
  bool writes_through() const { return temporary_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;       // as given, for messages
  std::string target_;     // what is replaced: path_, or the file a symlink names
  std::string temporary_;  // empty when writing through
  int fd_ = -1;
  bool committed_ = false;
};

void AtomicWriteFile(const std::string& path, std::string_view contents);
void AtomicWriteFile(const std::string& path, const void* data, size_t size);
void FsyncDirectory(const std::string& path);
std::string ParentDirectory(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace crucible
