#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"

namespace moebatch {
namespace {

TEST(Check, ThrowsWithExpressionFileAndLine) {
  try {
    int n = -1;
    MB_CHECK(n > 0, "n must be positive");
    FAIL() << "MB_CHECK did not throw";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("n must be positive"), std::string::npos) << what;
    EXPECT_NE(what.find("(n > 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("test_common.cpp:"), std::string::npos) << what;
  }
}

TEST(Logging, RejectsUnknownLevelAcceptsKnown) {
  EXPECT_THROW(init_logging("loud"), InputError);
  EXPECT_NO_THROW(init_logging("debug"));
  EXPECT_NO_THROW(init_logging("off"));
}

TEST(Paths, DefaultDbFollowsEnvironment) {
  setenv("MOEBATCH_DB", "/tmp/x/explicit.db", 1);
  EXPECT_EQ(default_db_path(), "/tmp/x/explicit.db");
  unsetenv("MOEBATCH_DB");
  setenv("XDG_DATA_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(default_db_path(), "/tmp/xdg/moebatch/jobs.db");
  unsetenv("XDG_DATA_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(default_db_path(), "/home/u/.local/share/moebatch/jobs.db");
}

}  // namespace
}  // namespace moebatch
