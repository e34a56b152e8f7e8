// Safe unpacking (src/stage/archive.h): a good archive, in each compression, unpacks to the same
// tree with its modes, mtimes and links; each kind of tar-slip member is refused by name with
// nothing written; a truncated archive is refused naming the archive and libarchive's message.
#include "stage/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

constexpr time_t kMtime = 1700000000;  // 2023-11-14, distinct from "now"

// One member to write: a file (type AE_IFREG, `data`), a folder, a symlink or a hard link
// (`link`), or a special file.
struct Item {
  std::string name;
  mode_t type = AE_IFREG;
  mode_t perm = 0644;
  std::string data;
  std::string link;
  bool hard = false;
  time_t mtime = kMtime;
};

Item File(std::string name, std::string data, mode_t perm = 0644, time_t mtime = kMtime) {
  return Item{std::move(name), AE_IFREG, perm, std::move(data), "", false, mtime};
}
Item Folder(std::string name, mode_t perm = 0755) {
  return Item{std::move(name), AE_IFDIR, perm, "", "", false, kMtime};
}
Item Symlink(std::string name, std::string target) {
  return Item{std::move(name), AE_IFLNK, 0777, "", std::move(target), false, kMtime};
}
Item HardLink(std::string name, std::string target) {
  return Item{std::move(name), AE_IFREG, 0644, "", std::move(target), true, kMtime};
}
Item Special(std::string name, mode_t type) {
  return Item{std::move(name), type, 0600, "", "", false, kMtime};
}

enum class Compression { kNone, kGzip, kZstd };

// Writes `items` as a pax tar with libarchive's writer.
void WriteArchive(const std::string& path, const std::vector<Item>& items,
                  Compression compression) {
  archive* writer = archive_write_new();
  ASSERT_EQ(archive_write_set_format_pax_restricted(writer), ARCHIVE_OK);
  if (compression == Compression::kGzip) {
    ASSERT_EQ(archive_write_add_filter_gzip(writer), ARCHIVE_OK);
  }
  if (compression == Compression::kZstd) {
    ASSERT_EQ(archive_write_add_filter_zstd(writer), ARCHIVE_OK);
  }
  ASSERT_EQ(archive_write_open_filename(writer, path.c_str()), ARCHIVE_OK);
  for (const Item& item : items) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, item.name.c_str());
    archive_entry_set_filetype(entry, item.type);
    archive_entry_set_perm(entry, item.perm);
    archive_entry_set_mtime(entry, item.mtime, 0);
    archive_entry_set_size(entry, static_cast<la_int64_t>(item.data.size()));
    if (item.hard) archive_entry_set_hardlink(entry, item.link.c_str());
    if (item.type == AE_IFLNK) archive_entry_set_symlink(entry, item.link.c_str());
    if (item.type == AE_IFCHR || item.type == AE_IFBLK)
      archive_entry_set_rdev(entry, makedev(1, 3));
    ASSERT_EQ(archive_write_header(writer, entry), ARCHIVE_OK) << archive_error_string(writer);
    if (!item.data.empty()) {
      ASSERT_EQ(archive_write_data(writer, item.data.data(), item.data.size()),
                static_cast<la_ssize_t>(item.data.size()));
    }
    archive_entry_free(entry);
  }
  ASSERT_EQ(archive_write_close(writer), ARCHIVE_OK);
  archive_write_free(writer);
}

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 generator(seed);
  std::string bytes(size, '\0');
  for (char& b : bytes) b = static_cast<char>(generator());
  return bytes;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Every name under `folder`, relative, sorted.
std::set<std::string> Listing(const std::string& folder) {
  std::set<std::string> names;
  for (const auto& item : fs::recursive_directory_iterator(folder))
    names.insert(item.path().lexically_relative(folder).string());
  return names;
}

class ArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/archive_test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    scratch_ = pattern;
    destination_ = scratch_ + "/dest";
    fs::create_directory(destination_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(scratch_, ignored);
  }
  std::string scratch_;
  std::string destination_;
};

TEST(IsArchiveTest, KnowsTheNamesYeetUnpacks) {
  for (const char* name : {"a.tar", "dir/a.tar.gz", "a.tgz", "a.tar.zst", "A.TAR.GZ"})
    EXPECT_TRUE(IsArchive(name)) << name;
  for (const char* name : {"a.gz", "a.zst", "a.zip", "tar", "a.tar.xz", "model.bin"})
    EXPECT_FALSE(IsArchive(name)) << name;
}

// The good tree: nested folders, an executable with setuid (dropped), a private file, an empty
// file, a 200 KB file, a symlink inside the folder, one that climbs but stays inside, a hard link.
std::vector<Item> GoodTree(const std::string& big) {
  return {Folder("./"),
          Folder("top/", 0755),
          Folder("top/bin/", 0750),
          File("top/bin/tool", "#!/bin/sh\necho hi\n", 04755),
          File("top/data/a/b/c.txt", "nested\n", 0640, kMtime - 3600),
          File("top/data/big.bin", big, 0444),
          File("top/empty", "", 0600),
          Symlink("top/link", "data/a/b/c.txt"),
          Symlink("top/data/a/up", "../big.bin"),
          HardLink("top/hard", "top/data/big.bin")};
}

class GoodArchiveTest : public ArchiveTest,
                        public ::testing::WithParamInterface<std::pair<Compression, const char*>> {
};

TEST_P(GoodArchiveTest, UnpacksTheSameTreeWithModesTimesAndLinks) {
  const std::string big = RandomBytes(200 << 10, 7);
  const std::string path = scratch_ + "/good" + GetParam().second;
  WriteArchive(path, GoodTree(big), GetParam().first);

  const ArchiveContents checked = CheckArchive(path);
  EXPECT_EQ(Listing(destination_).size(), 0u) << "CheckArchive wrote something";
  const ArchiveContents unpacked = UnpackArchive(path, destination_);
  for (const ArchiveContents& c : {checked, unpacked}) {
    EXPECT_EQ(c.files, 4);
    EXPECT_EQ(c.directories, 2);  // "./" is the destination itself
    EXPECT_EQ(c.links, 3);
    EXPECT_EQ(c.bytes, static_cast<int64_t>(big.size() + 18 + 7));
  }

  const std::string top = destination_ + "/top";
  EXPECT_EQ(Listing(destination_),
            (std::set<std::string>{"top", "top/bin", "top/bin/tool", "top/data", "top/data/a",
                                   "top/data/a/b", "top/data/a/b/c.txt", "top/data/a/up",
                                   "top/data/big.bin", "top/empty", "top/link", "top/hard"}));
  EXPECT_EQ(Slurp(top + "/bin/tool"), "#!/bin/sh\necho hi\n");
  EXPECT_EQ(Slurp(top + "/data/big.bin"), big);
  EXPECT_EQ(Slurp(top + "/empty"), "");
  EXPECT_EQ(Slurp(top + "/link"), "nested\n");  // through the symlink
  EXPECT_EQ(Slurp(top + "/data/a/up"), big);

  struct stat st;
  const auto mode_of = [&](const std::string& p) {
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode_of(top + "/bin/tool"), 0755u) << "setuid must be dropped";
  EXPECT_EQ(mode_of(top + "/bin"), 0750u);
  EXPECT_EQ(mode_of(top + "/data/a/b/c.txt"), 0640u);
  EXPECT_EQ(mode_of(top + "/data/big.bin"), 0444u);
  EXPECT_EQ(mode_of(top + "/empty"), 0600u);

  const auto mtime_of = [&](const std::string& p) {
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mtime;
  };
  EXPECT_EQ(mtime_of(top + "/bin/tool"), kMtime);
  EXPECT_EQ(mtime_of(top + "/data/a/b/c.txt"), kMtime - 3600);
  EXPECT_EQ(mtime_of(top + "/bin"), kMtime) << "a folder's mtime, set after its contents";
  EXPECT_EQ(mtime_of(top), kMtime);

  EXPECT_TRUE(fs::is_symlink(top + "/link"));
  EXPECT_EQ(fs::read_symlink(top + "/link").string(), "data/a/b/c.txt");
  EXPECT_EQ(fs::read_symlink(top + "/data/a/up").string(), "../big.bin");
  EXPECT_TRUE(fs::equivalent(top + "/hard", top + "/data/big.bin"));
  EXPECT_EQ(fs::hard_link_count(top + "/hard"), 2u);
  EXPECT_EQ(Listing(scratch_).count("top"), 0u);  // written under the destination only
}

INSTANTIATE_TEST_SUITE_P(Compressions, GoodArchiveTest,
                         ::testing::Values(std::make_pair(Compression::kNone, ".tar"),
                                           std::make_pair(Compression::kGzip, ".tar.gz"),
                                           std::make_pair(Compression::kZstd, ".tar.zst")),
                         [](const auto& info) {
                           return std::string(info.param.first == Compression::kNone   ? "tar"
                                              : info.param.first == Compression::kGzip ? "gzip"
                                                                                       : "zstd");
                         });

// One refused kind: the archive, the member the message must name, and the reason's words.
struct Refusal {
  const char* kind;
  std::vector<Item> items;
  std::string member;
  std::string reason;
};

class RefusedArchiveTest : public ArchiveTest, public ::testing::WithParamInterface<Refusal> {};

TEST_P(RefusedArchiveTest, RefusesTheMemberByNameAndWritesNothing) {
  const Refusal& refusal = GetParam();
  const std::string path = scratch_ + "/bad.tar.gz";
  WriteArchive(path, refusal.items, Compression::kGzip);
  for (int unpack = 0; unpack < 2; ++unpack) {
    try {
      if (unpack)
        UnpackArchive(path, destination_);
      else
        CheckArchive(path);
      ADD_FAILURE() << refusal.kind << ": not refused";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.exit_code(), kExitBadData) << message;
      EXPECT_NE(message.find("yeet: " + path + ": refused member \"" + refusal.member + "\": "),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(refusal.reason), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
    }
    EXPECT_EQ(Listing(scratch_), (std::set<std::string>{"dest", "bad.tar.gz"}));
  }
}

INSTANTIATE_TEST_SUITE_P(
    TarSlip, RefusedArchiveTest,
    ::testing::Values(
        Refusal{
            "absolute", {File("ok", "x"), File("/tmp/evil", "x")}, "/tmp/evil", "an absolute path"},
        Refusal{"dotdot", {File("../evil", "x")}, "../evil", "a path with '..' (tar-slip)"},
        Refusal{"dotdot_inside", {File("a/../../evil", "x")}, "a/../../evil", "'..'"},
        Refusal{"escaping_symlink",
                {Folder("a/"), Symlink("a/out", "../../outside")},
                "a/out",
                "which leaves the destination"},
        Refusal{"absolute_symlink",
                {Symlink("passwd", "/etc/passwd")},
                "passwd",
                "a symlink to the absolute path \"/etc/passwd\""},
        // Lexically s/x/../.. is the top folder, but s is "." so it climbs one more.
        Refusal{"escaping_symlink_chain",
                {Symlink("s", "."), Symlink("t", "s/x/../..")},
                "t",
                "which leaves the destination"},
        // Fine when checked (t2 is not yet a symlink), refused once t2 is known.
        Refusal{"escaping_symlink_later",
                {Symlink("t1", "t2/.."), Symlink("t2", ".")},
                "t1",
                "which leaves the destination"},
        Refusal{
            "symlink_loop", {Symlink("l1", "l2/x"), Symlink("l2", "l1/y")}, "l1", "a symlink loop"},
        Refusal{"escaping_hard_link",
                {File("f", "x"), HardLink("h", "../outside/file")},
                "h",
                "a hard link to \"../outside/file\", outside the destination"},
        Refusal{"absolute_hard_link", {HardLink("h", "/etc/passwd")}, "h", "outside"},
        Refusal{"hard_link_to_symlink",
                {Symlink("s", "f"), File("f", "x"), HardLink("h", "s")},
                "h",
                "not a regular file earlier in the archive"},
        Refusal{"write_through_symlink",
                {Folder("sub/"), Symlink("lnk", "sub"), File("lnk/evil", "x")},
                "lnk/evil",
                "written through the symlink \"lnk\""},
        Refusal{"replace_symlink",
                {File("f", "x"), Symlink("lnk", "f"), File("lnk", "y")},
                "lnk",
                "replace the symlink \"lnk\""},
        Refusal{"symlink_over_folder",
                {File("d/f", "x"), Symlink("d", ".")},
                "d",
                "a symlink in place of the folder"},
        Refusal{"char_device",
                {Folder("dev/"), Special("dev/null", AE_IFCHR)},
                "dev/null",
                "a character device"},
        Refusal{"block_device", {Special("sda", AE_IFBLK)}, "sda", "a block device"},
        Refusal{"fifo", {Special("pipe", AE_IFIFO)}, "pipe", "a FIFO"}),
    [](const auto& info) { return std::string(info.param.kind); });

TEST_F(ArchiveTest, TruncatedArchiveIsRefusedNamingItAndLibarchivesMessage) {
  const std::string path = scratch_ + "/cut.tar.gz";
  WriteArchive(path, {File("a.bin", RandomBytes(256 << 10, 1)), File("b.bin", "b")},
               Compression::kGzip);
  fs::resize_file(path, fs::file_size(path) / 2);
  for (int unpack = 0; unpack < 2; ++unpack) {
    try {
      if (unpack)
        UnpackArchive(path, destination_);
      else
        CheckArchive(path);
      ADD_FAILURE() << "a truncated archive was accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.exit_code(), kExitBadData) << message;
      EXPECT_EQ(message.rfind("yeet: " + path + ": cannot read the archive: ", 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  EXPECT_TRUE(fs::is_empty(destination_));
}

TEST_F(ArchiveTest, NotAnArchiveIsRefused) {
  const std::string path = scratch_ + "/notes.tar";
  std::ofstream(path) << "these are notes, not a tar archive\n";
  try {
    CheckArchive(path);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot read the archive"), std::string::npos) << e.what();
  }
}

TEST_F(ArchiveTest, MissingArchiveIsAUsageError) {
  try {
    CheckArchive(scratch_ + "/missing.tar");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing.tar"), std::string::npos) << e.what();
  }
}

TEST_F(ArchiveTest, DestinationMustBeAnEmptyFolder) {
  const std::string path = scratch_ + "/small.tar";
  WriteArchive(path, {File("a", "a")}, Compression::kNone);
  std::ofstream(destination_ + "/already") << "x";
  try {
    UnpackArchive(path, destination_);
    ADD_FAILURE() << "unpacked into a non-empty folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("not empty"), std::string::npos) << e.what();
  }
  EXPECT_THROW(UnpackArchive(path, scratch_ + "/nowhere"), Error);
  EXPECT_EQ(Listing(destination_), std::set<std::string>{"already"});
}

}  // namespace
}  // namespace crucible
