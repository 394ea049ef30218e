// examples/: the Python producer (ZeroMQ + sqlite3) and the shell producer (sqlite3 + moebatch
// export) run as a user would run them, against a real `moebatch serve` on the demo model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

struct ExampleDaemon {
  test::TempDir dir;
  std::filesystem::path db = dir.path() / "jobs.db";
  test::Child child{test::join_args({{test::moebatch_bin(), "serve", "--db", db.string(), "--bind",
                                      "tcp://127.0.0.1:*", "--http-port", "-1", "--poll-ms", "10"},
                                     test::demo_model_flags(),
                                     test::small_engine_flags(4)}),
                    dir.path() / "serve.log"};
  std::string router;

  /// Waits for the ready line on stdout ({"http_port", "pub", "router"}).
  bool ready() {
    return test::wait_until(
        [&] {
          const auto line = test::ready_line(child.read_log());
          if (line) router = (*line)["router"];
          return line.has_value();
        },
        60s);
  }
};

std::string example(const char* name) { return test::source_dir() + "/examples/" + name; }

TEST(Examples, PythonProducerSubmitsOverZeroMqAndSqlAndWaitsForItsBatch) {
  const std::string python = MOEBATCH_PYTHON_ZMQ;
  if (python.empty()) GTEST_SKIP() << "no python3 with the zmq module (Debian: python3-zmq)";
  ExampleDaemon d;
  ASSERT_TRUE(d.ready()) << d.child.read_log();
  const std::vector<std::string> argv = {python,         example("python_producer.py"),
                                         "--endpoint",   d.router,
                                         "--db",         d.db.string(),
                                         "--batch",      "py-batch",
                                         "--jobs",       "6",
                                         "--max-tokens", "4"};
  test::RunResult r = test::run_command(argv, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << d.child.read_log();
  EXPECT_NE(r.out.find("batch py-batch: 6 new job(s), 0 already known"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("py-batch/zmq-2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("py-batch/sql-2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch py-batch: 6 done, 0 not done"), std::string::npos) << r.out;
  // Run again: every key is known, nothing is submitted twice.
  r = test::run_command(argv, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("batch py-batch: 0 new job(s), 6 already known"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("batch py-batch: 6 done, 0 not done"), std::string::npos) << r.out;
  d.child.signal(SIGTERM);
  EXPECT_EQ(d.child.wait_for(30s), 0);
}

TEST(Examples, ShellProducerInsertsWithSqliteAndExportsItsBatch) {
  const std::string sqlite3 = MOEBATCH_SQLITE3;
  if (sqlite3.empty()) GTEST_SKIP() << "no sqlite3 command-line tool (Debian: sqlite3)";
  ExampleDaemon d;
  ASSERT_TRUE(d.ready()) << d.child.read_log();
  const auto prompts = d.dir.path() / "prompts.txt";
  test::write_file(prompts, "first prompt\nit's the second\n\nthird, no newline at the end");
  const std::vector<std::string> argv = {"/usr/bin/env",
                                         "MOEBATCH=" + test::moebatch_bin(),
                                         "MAX_TOKENS=4",
                                         "bash",
                                         example("shell_producer.sh"),
                                         d.db.string(),
                                         "sh-batch",
                                         prompts.string()};
  test::RunResult r = test::run_command(argv, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << d.child.read_log();
  // One OpenAI Batch output line per prompt (the blank line is skipped), each a success.
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const json j = json::parse(line);
    EXPECT_EQ(j["response"]["status_code"], 200) << line;
    EXPECT_EQ(j["response"]["body"]["usage"]["completion_tokens"], 4) << line;
  }
  EXPECT_EQ(n, 3) << r.out;
  EXPECT_NE(r.err.find("batch sh-batch: finished, 0 job(s) not done"), std::string::npos) << r.err;
  // Again: INSERT OR IGNORE on the same keys adds nothing.
  r = test::run_command(argv, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("batch sh-batch: 3 job(s)"), std::string::npos) << r.err;
  d.child.signal(SIGTERM);
  EXPECT_EQ(d.child.wait_for(30s), 0);
}

}  // namespace
}  // namespace moebatch
