// Writes never replace a special file (a device is written through, a directory refused); reads
// take regular files only, and config-like reads are capped.
#include "common/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <string>

#include "common/error.h"

namespace crucible {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/files_test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // A character device with the numbers of /dev/null (1,3), /dev/zero (1,5) or /dev/full (1,7),
  // made here (never the system's /dev); skips the test where mknod is not allowed.
  std::string CharDevice(const std::string& name, unsigned minor) {
    const std::string path = Path(name);
    if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, minor)) != 0) return "";
    return path;
  }

  static mode_t Type(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
  }

  static std::string Contents(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::string dir_;
};

#define REQUIRE_DEVICE(path) \
  if ((path).empty()) GTEST_SKIP() << "mknod is not allowed here (not root)"

int ExitCodeOf(const std::function<void()>& call, std::string* message) {
  try {
    call();
  } catch (const Error& e) {
    *message = e.what();
    return e.exit_code();
  }
  return 0;
}

TEST_F(FilesTest, WritingToACharacterDeviceWritesThroughAndLeavesTheDevice) {
  const std::string null = CharDevice("null", 3);
  REQUIRE_DEVICE(null);
  AtomicWriteFile(null, "applied = true\n");
  EXPECT_EQ(Type(null), S_IFCHR);  // not replaced by a regular file
}

TEST_F(FilesTest, AFullDeviceIsAnIoErrorAndStaysADevice) {
  const std::string full = CharDevice("full", 7);
  REQUIRE_DEVICE(full);
  std::string message;
  EXPECT_EQ(ExitCodeOf([&] { AtomicWriteFile(full, "x = 1\n"); }, &message), kExitIo);
  EXPECT_NE(message.find(full), std::string::npos) << message;
  EXPECT_EQ(Type(full), S_IFCHR);
}

TEST_F(FilesTest, WritingToAFifoStreamsTheBytesToItsReader) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::future<std::string> read = std::async(std::launch::async, [&] { return Contents(fifo); });
  AtomicWriteFile(fifo, "through the pipe\n");
  EXPECT_EQ(read.get(), "through the pipe\n");
  EXPECT_EQ(Type(fifo), S_IFIFO);
}

TEST_F(FilesTest, WritingOverADirectoryIsRefusedAsUsage) {
  const std::string folder = Path("folder");
  ASSERT_EQ(::mkdir(folder.c_str(), 0755), 0);
  std::string message;
  EXPECT_EQ(ExitCodeOf([&] { AtomicWriteFile(folder, "x\n"); }, &message), kExitUsage);
  EXPECT_NE(message.find(folder + ": a directory"), std::string::npos) << message;
  EXPECT_EQ(Type(folder), S_IFDIR);
}

TEST_F(FilesTest, WritingThroughASymlinkReplacesTheFileAndKeepsTheLink) {
  const std::string file = Path("real.toml"), link = Path("link.toml");
  AtomicWriteFile(file, "old\n");
  ASSERT_EQ(::symlink("real.toml", link.c_str()), 0);
  AtomicWriteFile(link, "new\n");
  EXPECT_EQ(Type(link), S_IFLNK);
  EXPECT_EQ(Contents(file), "new\n");
}

TEST_F(FilesTest, WritingARegularFileReplacesIt) {
  const std::string file = Path("out.json");
  AtomicWriteFile(file, "old\n");
  AtomicWriteFile(file, "new\n");
  EXPECT_EQ(Contents(file), "new\n");
  EXPECT_EQ(Type(file + ".tmp." + std::to_string(::getpid())), 0);  // no temporary left
}

TEST_F(FilesTest, AnOutputNeverCommittedLeavesTheTargetAndNoTemporary) {
  const std::string file = Path("out.json");
  AtomicWriteFile(file, "old\n");
  {
    OutputFile out(file);
    EXPECT_FALSE(out.writes_through());
    out.Write("half");
  }
  EXPECT_EQ(Contents(file), "old\n");
  EXPECT_EQ(Type(file + ".tmp." + std::to_string(::getpid())), 0);
}

TEST_F(FilesTest, ReadingADeviceIsRefusedAsUsageNamingTheFile) {
  for (unsigned minor : {3u, 5u}) {  // /dev/null reads empty, /dev/zero never ends
    const std::string device = CharDevice("device" + std::to_string(minor), minor);
    REQUIRE_DEVICE(device);
    std::string message;
    EXPECT_EQ(ExitCodeOf([&] { ReadFile(device); }, &message), kExitUsage);
    EXPECT_NE(message.find(device + ": a character device, not a regular file"), std::string::npos)
        << message;
  }
}

TEST_F(FilesTest, ReadingADirectoryIsRefusedAsUsage) {
  std::string message;
  EXPECT_EQ(ExitCodeOf([&] { ReadFile(dir_); }, &message), kExitUsage);
  EXPECT_NE(message.find(dir_ + ": a directory"), std::string::npos) << message;
}

TEST_F(FilesTest, AConfigLikeInputLargerThanTheCapIsRefusedStatingTheCap) {
  const std::string big = Path("big.toml");
  const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kConfigFileMaxBytes) + 1), 0);  // sparse
  ::close(fd);
  std::string message;
  EXPECT_EQ(ExitCodeOf([&] { ReadConfigFile(big); }, &message), kExitUsage);
  EXPECT_NE(message.find(big + ": larger than 64 MiB"), std::string::npos) << message;

  ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(kConfigFileMaxBytes)), 0);
  EXPECT_EQ(ReadConfigFile(big).size(), kConfigFileMaxBytes);  // the cap itself is read
}

TEST_F(FilesTest, ASymlinkLoopIsReportedAsALoopNotAsMissing) {
  const std::string a = Path("a"), b = Path("b");
  ASSERT_EQ(::symlink("b", a.c_str()), 0);
  ASSERT_EQ(::symlink("a", b.c_str()), 0);
  std::string message;
  EXPECT_EQ(ExitCodeOf([&] { ReadFile(a); }, &message), kExitUsage);
  EXPECT_NE(message.find(a + ": a symlink loop (ELOOP)"), std::string::npos) << message;
  EXPECT_EQ(StatFailure(a), "a symlink loop (ELOOP)");
  EXPECT_EQ(StatFailure(Path("missing")), "no such file");
  EXPECT_EQ(StatFailure(dir_), "");
  EXPECT_EQ(ExitCodeOf([&] { AtomicWriteFile(a, "x\n"); }, &message), kExitUsage);
  EXPECT_NE(message.find("symlink loop"), std::string::npos) << message;
}

}  // namespace
}  // namespace crucible
