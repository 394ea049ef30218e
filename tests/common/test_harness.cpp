// The shared test harness itself: temp dirs go away, subprocess output and statuses arrive
// intact (both streams at once, signals, timeouts), waits and helpers do what they say.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/common/compare.h"
#include "tests/common/files.h"
#include "tests/common/prompts.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"

namespace moebatch::test {
namespace {

using namespace std::chrono_literals;

RunResult sh(const std::string& script, std::chrono::milliseconds timeout = 60s) {
  return run_command({"/bin/sh", "-c", script}, timeout);
}

TEST(Harness, TempDirIsFreshAndRemovedWithItsContents) {
  std::filesystem::path kept;
  {
    TempDir a, b;
    EXPECT_NE(a.path(), b.path());
    ASSERT_TRUE(std::filesystem::is_directory(a.path()));
    EXPECT_TRUE(std::filesystem::is_empty(a.path()));
    EXPECT_EQ(a.file("x.bin"), (a.path() / "x.bin").string());
    std::filesystem::create_directories(a.path() / "sub");
    write_file(a.path() / "sub" / "f", "data");
    kept = a.path();
  }
  EXPECT_FALSE(std::filesystem::exists(kept));
}

TEST(Harness, FilesRoundTripBytesAndMissingReadsEmpty) {
  TempDir dir;
  const std::string bytes("a\0b\xff\n", 5);
  write_file(dir.file("f"), bytes);
  EXPECT_EQ(read_file(dir.file("f")), bytes);
  write_file(dir.file("f"), "short");
  EXPECT_EQ(read_file(dir.file("f")), "short");
  EXPECT_EQ(read_file(dir.file("missing")), "");
  EXPECT_THROW(write_file(dir.path() / "no-such-dir" / "f", "x"), std::runtime_error);
  EXPECT_TRUE(std::filesystem::is_directory(test_data_dir()));
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(source_dir()) / "CMakeLists.txt"));
}

TEST(Harness, RunCommandCapturesBothStreamsAndTheExitCode) {
  RunResult r = sh("printf out; printf err >&2; exit 3");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "out");
  EXPECT_EQ(r.err, "err");
  // Far more than a pipe buffer on both streams: drained together, no deadlock.
  r = sh("head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.size(), 300000u);
  EXPECT_EQ(r.err.size(), 300000u);
  EXPECT_EQ(run_command({"/nonexistent/binary"}).exit_code, 127);
}

TEST(Harness, RunCommandReportsSignalsAndKillsAtTheTimeout) {
  EXPECT_EQ(sh("kill -TERM $$").exit_code, -SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = sh("echo started; exec sleep 30", 300ms);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, -SIGKILL);
  EXPECT_EQ(r.out, "started\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(Harness, ChildReadsStdoutLinesAndWaitsForItsStatus) {
  Child c({"/bin/sh", "-c", "echo first; echo second; exit 4"});
  EXPECT_EQ(c.read_line(), "first");
  EXPECT_EQ(c.read_line(), "second");
  EXPECT_EQ(c.read_line(), "");  // EOF
  EXPECT_EQ(c.wait(), 4);
  EXPECT_EQ(c.pid(), -1);
  EXPECT_THROW(c.wait(), std::logic_error);
}

TEST(Harness, ChildWithLogIsSignalledAndWaitedForWithATimeout) {
  TempDir dir;
  Child c({"/bin/sh", "-c", "echo to-out; echo to-err >&2; exec sleep 30"}, dir.path() / "log");
  EXPECT_TRUE(wait_until([&] { return c.read_log() == "to-out\nto-err\n"; }, 10s)) << c.read_log();
  EXPECT_EQ(c.wait_for(50ms), std::nullopt);
  c.signal(SIGTERM);
  EXPECT_EQ(c.wait_for(10s), -SIGTERM);
  // A child still running at scope exit is killed and reaped; a moved-from one is left alone.
  const auto t0 = std::chrono::steady_clock::now();
  {
    Child a({"/bin/sleep", "30"});
    Child b(std::move(a));
    EXPECT_EQ(a.pid(), -1);
    EXPECT_GT(b.pid(), 0);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(Harness, WaitUntilReturnsOnceTrueOrAtTheDeadline) {
  int calls = 0;
  EXPECT_TRUE(wait_until([&] { return ++calls == 3; }, 10s));
  EXPECT_EQ(calls, 3);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(wait_until([] { return false; }, 50ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
}

TEST(Harness, RandomPromptStaysInTheVocabulary) {
  std::mt19937 rng(std::random_device{}());
  const auto p = random_prompt(rng, 500, 7);
  ASSERT_EQ(p.size(), 500u);
  for (int32_t t : p) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 7);
  }
  EXPECT_TRUE(random_prompt(rng, 0, 7).empty());
}

TEST(Harness, RelErrIsRelativeL2AndNanNeverPasses) {
  const float b[] = {3, 4};
  const float same[] = {3, 4};
  const float off[] = {3, 4.5f};
  const float nan[] = {3, std::nanf("")};
  EXPECT_EQ(rel_err(same, b, 2), 0.0);
  EXPECT_DOUBLE_EQ(rel_err(off, b, 2), 0.1);
  EXPECT_TRUE(std::isinf(rel_err(nan, b, 2)));
}

}  // namespace
}  // namespace moebatch::test
