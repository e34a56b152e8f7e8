// The run directory a config names: job.dump_folder, or runs/<job.name> for a job.name that is a
// plain folder name (no path separator, not "." or ".."): a name never puts the run outside runs/.
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "common/error.h"
#include "train/trainer.h"

namespace crucible {
namespace {

Config WithName(const std::string& name) {
  Config config = Config::Defaults();
  config.Set("job.name", name);
  return config;
}

TEST(RunDirectory, IsRunsSlashTheJobName) {
  EXPECT_EQ(RunDirectory(WithName("my-run.v2")), "runs/my-run.v2");
  EXPECT_EQ(RunDirectory(WithName("a..b")), "runs/a..b");
}

TEST(RunDirectory, AJobNameWithAPathSeparatorOrDotsIsAUsageErrorNamingTheKey) {
  for (const std::string name : {"../../../escaped", "a/b", "/tmp/x", "..", ".", ""}) {
    try {
      RunDirectory(WithName(name));
      ADD_FAILURE() << "job.name = '" << name << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
      const std::string message = e.what();
      EXPECT_NE(message.find("job.name"), std::string::npos) << message;
      EXPECT_NE(message.find("job.dump_folder"), std::string::npos) << message;
    }
  }
}

TEST(RunDirectory, ADumpFolderIsTakenAsGivenWhateverTheName) {
  Config config = WithName("../x");
  config.Set("job.dump_folder", std::string("../elsewhere/run"));
  EXPECT_EQ(RunDirectory(config), "../elsewhere/run");
}

}  // namespace
}  // namespace crucible
