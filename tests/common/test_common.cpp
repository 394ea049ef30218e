#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/json_parse.h"
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

std::string nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(JsonParse, NestingIsBoundedAndDeepInputIsRefusedWithoutRecursion) {
  std::string problem;
  // kMaxJsonDepth containers in all: accepted, printable
  nlohmann::json ok = parse_json_bounded(nested(kMaxJsonDepth), &problem);
  EXPECT_EQ(problem, "");
  EXPECT_EQ(ok.dump(), nested(kMaxJsonDepth));
  // one more, and far more (printing or copying 10^6 levels would overflow the stack)
  for (int levels : {kMaxJsonDepth + 1, 1'000'000}) {
    const nlohmann::json j = parse_json_bounded(nested(levels), &problem);
    EXPECT_TRUE(j.is_discarded());
    EXPECT_EQ(problem, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  // deep inside an object, beside ordinary fields
  EXPECT_TRUE(
      parse_json_bounded(R"({"a": 1, "b": )" + nested(5000) + "}", &problem).is_discarded());
  EXPECT_FALSE(problem.empty());
  // invalid JSON says where
  EXPECT_TRUE(parse_json_bounded("{\"a\": ", &problem).is_discarded());
  EXPECT_NE(problem.find("not valid JSON"), std::string::npos) << problem;
  EXPECT_NE(problem.find("parse error"), std::string::npos) << problem;
  // without a problem pointer it still never throws
  EXPECT_TRUE(parse_json_bounded(nested(1'000'000)).is_discarded());
  // a number beyond double is nlohmann's out_of_range, not a parse_error: refused all the same
  // (it escaped the parser as an exception before: a checkpoint index with it ended the process)
  for (const char* overflow : {R"({"total_size": 6E20222214})", "[1e999]", "-1e400"}) {
    EXPECT_TRUE(parse_json_bounded(overflow, &problem).is_discarded()) << overflow;
    EXPECT_NE(problem.find("number overflow"), std::string::npos) << problem;
    EXPECT_TRUE(parse_json_bounded(overflow).is_discarded()) << overflow;
  }
}

TEST(JsonParse, ExcerptsAreShortAndCutAtCharacterBoundaries) {
  EXPECT_EQ(json_excerpt(nlohmann::json("short")), "\"short\"");
  // "é" is two bytes: whatever the limit, the cut never falls between them
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";
  for (std::size_t max = 1; max < 40; ++max) {
    const std::string e = json_excerpt(nlohmann::json(accents), max);
    ASSERT_LE(e.size(), max + std::string("…").size());
    // valid UTF-8: printing it as JSON (strict) must not throw
    EXPECT_NO_THROW((void)nlohmann::json(e).dump()) << max;
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
