// File helpers. Everything a run writes goes through AtomicWriteFile: the data lands under a
// temporary name in the same folder, is fsynced, then renamed over the target, so a reader sees
// either the old file or the complete new one, never a partial write.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace crucible {

std::string ReadFile(const std::string& path);  // throws UsageError if missing, IoError otherwise
bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);
void MakeDirectories(const std::string& path);  // mkdir -p; throws IoError
void AtomicWriteFile(const std::string& path, std::string_view contents);
void AtomicWriteFile(const std::string& path, const void* data, size_t size);
void FsyncDirectory(const std::string& path);
std::string ParentDirectory(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace crucible
