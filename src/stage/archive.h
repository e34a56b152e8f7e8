// Safe unpacking of the archives `crucible yeet` stages (.tar, .tar.gz/.tgz, .tar.zst), read and
// written with libarchive.
//
// An archive is unpacked only when every member passes the checks below (tar-slip and friends);
// the first member that fails is named in a one-line crucible::Error with exit code kExitBadData:
//   - a path that is absolute or has a `..` component;
//   - a symlink whose target is absolute, or whose target, resolved against the link's own folder
//     (following the archive's other symlinks), leaves the destination or loops;
//   - a hard link whose target is not a regular file earlier in the archive (so it cannot leave
//     the destination, nor link to a symlink);
//   - a member that would be written through, or replace, a symlink earlier in the archive;
//   - a character or block device, a FIFO, a socket, or any other special file.
// What is written: regular files, directories, symlinks and hard links, with their permission
// bits (never setuid, setgid or sticky; never owners) and their mtimes. libarchive's own secure
// checks (ARCHIVE_EXTRACT_SECURE_SYMLINKS, _SECURE_NODOTDOT) stay on while writing, so no write
// ever follows a symlink. The members are written under the destination's canonical absolute
// path (no chdir, which would move every thread), so _SECURE_NOABSOLUTEPATHS cannot be set: the
// member names themselves are refused when absolute, above.
#pragma once

#include <cstdint>
#include <string>

namespace crucible {

// True for the names yeet unpacks: *.tar, *.tar.gz, *.tgz, *.tar.zst (by name, not content).
bool IsArchive(const std::string& path);

// What an archive holds (members that would be written; a `./` entry for the top folder is not
// counted). `links` counts symlinks and hard links; `bytes` the regular files' contents.
struct ArchiveContents {
  int64_t files = 0;
  int64_t directories = 0;
  int64_t links = 0;
  int64_t bytes = 0;
};

// Checks every member of `archive` without writing anything. Throws crucible::Error with
// kExitBadData naming the archive and the first refused member and why, or naming the archive
// and libarchive's message when it is corrupt or truncated; UsageError when it cannot be opened.
ArchiveContents CheckArchive(const std::string& archive);

// Unpacks `archive` into `destination`, an existing, empty directory, after CheckArchive passes
// (each member is checked again as it is written). Throws UsageError when `destination` is not an
// empty directory, IoError when a member cannot be written (naming it).
ArchiveContents UnpackArchive(const std::string& archive, const std::string& destination);

}  // namespace crucible
