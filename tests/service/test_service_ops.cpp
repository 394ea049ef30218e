// What an operator sees of a real `moebatch serve`: systemd notifications (READY, STATUS,
// WATCHDOG, STOPPING) on a notification socket the test owns; JSON log lines with UTC
// timestamps, the throughput line, a batch's completion and the summary of a SIGTERM that
// gives running jobs back; token counters that move while jobs run; the metrics-only
// listener; exit status 2 for usage errors.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "queue/job_store.h"
#include "service/systemd_notify.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

/// `moebatch serve` on the demo model with a ready file; `env` is exported first.
struct ServeWithReadyFile {
  std::filesystem::path ready_file;
  test::Child child;
  json ready;

  ServeWithReadyFile(const std::filesystem::path& dir, const std::string& env,
                     const std::vector<std::string>& extra)
      : ready_file(dir / "ready.json"), child(argv(dir, env, extra), dir / "serve.log") {}

  static std::vector<std::string> argv(const std::filesystem::path& dir, const std::string& env,
                                       const std::vector<std::string>& extra) {
    std::vector<std::string> a =
        test::join_args({{test::moebatch_bin(), "serve", "--db", (dir / "jobs.db").string(),
                          "--bind", "tcp://127.0.0.1:*", "--http-port", "0", "--poll-ms", "10",
                          "--ready-file", (dir / "ready.json").string()},
                         test::demo_model_flags(),
                         test::small_engine_flags(4),
                         extra});
    if (env.empty()) return a;
    std::vector<std::string> sh = {"/bin/sh", "-c", env + " && exec \"$0\" \"$@\""};
    sh.insert(sh.end(), a.begin(), a.end());
    return sh;
  }
  bool wait_ready() {
    auto r = test::wait_ready(ready_file, 60s);
    if (r) ready = *r;
    return r.has_value();
  }
  std::string metrics() { return test::http_get(ready["http_port"].get<int>(), "/metrics").second; }
};

/// The value of an unlabelled sample, or -1.
double sample(const std::string& metrics, const std::string& name) {
  const auto p = metrics.find("\n" + name + " ");
  if (p == std::string::npos) return -1;
  return std::stod(metrics.substr(p + name.size() + 2));
}

/// A datagram socket bound at `path`, as systemd's notification socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::filesystem::path& path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ok_ = fd_ >= 0 && path.string().size() < sizeof(addr.sun_path) &&
          bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;
  bool ok() const { return ok_; }

  /// Messages until one contains `want` (kept, with the earlier ones, in `seen`), or timeout.
  bool wait_for(const std::string& want, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      seen.emplace_back(buf, static_cast<size_t>(n));
      if (seen.back().find(want) != std::string::npos) return true;
    }
    return false;
  }
  std::vector<std::string> seen;  ///< every message received, in order

 private:
  int fd_ = -1;
  bool ok_ = false;
};

TEST(ServiceOps, SystemdNotificationsReadyWatchdogStatusStopping) {
  if (!SystemdNotifier::built_with_systemd()) GTEST_SKIP() << "built without libsystemd";
  test::TempDir dir;
  const auto sock_path = dir.path() / "notify.sock";
  NotifySocket sock(sock_path);
  ASSERT_TRUE(sock.ok()) << sock_path;
  // WATCHDOG_USEC 300 ms: a ping every 150 ms.
  ServeWithReadyFile s(dir.path(),
                       "NOTIFY_SOCKET=" + sock_path.string() +
                           " WATCHDOG_USEC=300000; export NOTIFY_SOCKET "
                           "WATCHDOG_USEC",
                       {});
  ASSERT_TRUE(sock.wait_for("READY=1", 60s)) << s.child.read_log();
  EXPECT_EQ(sock.seen.front(), "STATUS=loading the model");
  EXPECT_NE(sock.seen.back().find("STATUS=serving: 0/4 slots busy"), std::string::npos)
      << sock.seen.back();
  // The readiness comes once the listeners are bound: the ready file is there already.
  EXPECT_TRUE(std::filesystem::exists(s.ready_file));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sock.wait_for("WATCHDOG=1", 2s)) << "ping " << i;
  s.child.signal(SIGTERM);
  ASSERT_TRUE(sock.wait_for("STOPPING=1", 10s)) << s.child.read_log();
  EXPECT_NE(sock.seen.back().find("STATUS=draining"), std::string::npos) << sock.seen.back();
  EXPECT_EQ(s.child.wait_for(30s), 0) << s.child.read_log();
}

TEST(ServiceOps, JsonLogsThroughputBatchCompletionCountersAndSigtermSummary) {
  test::TempDir dir;
  const auto db = dir.path() / "jobs.db";
  // --log-format and --log-level after the subcommand; nothing waits at SIGTERM.
  ServeWithReadyFile s(dir.path(), "",
                       {"--log-format", "json", "--log-level", "info", "--log-stats-interval-s",
                        "1", "--shutdown-timeout-s", "0", "--metrics-port", "0"});
  ASSERT_TRUE(s.wait_ready()) << s.child.read_log();
  JobStore store(test::store_options(db));
  auto submit = [&](const std::string& batch, int n, int64_t max_tokens) {
    std::vector<JobSpec> specs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      specs[static_cast<size_t>(i)].prompt = batch + " job " + std::to_string(i);
      specs[static_cast<size_t>(i)].sampling.max_tokens = max_tokens;
      specs[static_cast<size_t>(i)].sampling.temperature = 0;
      specs[static_cast<size_t>(i)].batch_id = batch;
    }
    store.submit_many(specs);
  };
  auto count = [&](const std::string& where) {
    return test::query_i64(db, "SELECT count(*) FROM jobs WHERE " + where);
  };

  submit("short", 3, 4);
  ASSERT_TRUE(test::wait_until([&] { return count("state = 'done'") == 3; }, 30s))
      << s.child.read_log();
  EXPECT_TRUE(test::wait_until(
      [&] { return s.child.read_log().find("batch 'short' complete") != std::string::npos; }, 10s))
      << s.child.read_log();

  // Long jobs: the token counters move while they run, long before any finishes.
  const std::string before = s.metrics();
  submit("long", 6, 3000);
  ASSERT_TRUE(test::wait_until(
      [&] {
        const std::string m = s.metrics();
        return sample(m, "moebatch_engine_slots_busy") == 4 &&
               sample(m, "moebatch_generation_tokens_total") >
                   sample(before, "moebatch_generation_tokens_total") + 20;
      },
      30s))
      << s.metrics();
  const std::string during = s.metrics();
  EXPECT_EQ(count("batch_id = 'long' AND state = 'done'"), 0);
  EXPECT_GT(sample(during, "moebatch_prompt_tokens_total"),
            sample(before, "moebatch_prompt_tokens_total"));
  EXPECT_GT(sample(during, "moebatch_kv_cache_usage_ratio"), 0);
  EXPECT_EQ(sample(during, "moebatch_engine_slots_usage_ratio"), 1);
  EXPECT_TRUE(test::wait_until(
      [&] { return s.child.read_log().find("slots 4/4 busy") != std::string::npos; }, 5s));

  // The metrics-only listener serves /metrics and /health, not the API.
  const int mport = s.ready["metrics_port"].get<int>();
  ASSERT_GT(mport, 0);
  const auto [mstatus, mbody] = test::http_get(mport, "/metrics");
  EXPECT_EQ(mstatus, 200);
  EXPECT_NE(mbody.find("process_cpu_seconds_total"), std::string::npos);
  EXPECT_EQ(test::http_get(mport, "/health").first, 200);
  EXPECT_EQ(test::http_get(mport, "/v1/models").first, 404);

  s.child.signal(SIGTERM);
  ASSERT_EQ(s.child.wait_for(30s), 0) << s.child.read_log();
  EXPECT_EQ(count("batch_id = 'long' AND state = 'queued'"), 6);
  const std::string log = s.child.read_log();
  EXPECT_NE(log.find("stopped: 6 job(s) went back to the queue (2 not started, 4 still running"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("\"msg\":\"throughput: "), std::string::npos) << log;
  // Every line is one JSON object; log lines carry a UTC time with its offset.
  std::istringstream lines(log);
  int log_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    if (!j.contains("msg")) continue;  // the ready line on stdout
    ++log_lines;
    const std::string t = j["time"].get<std::string>();
    EXPECT_EQ(t.size(), 29u) << t;  // 2026-12-01T10:48:38.743+00:00
    EXPECT_EQ(t.substr(t.size() - 6), "+00:00") << t;
    EXPECT_TRUE(j["level"].is_string());
    EXPECT_TRUE(j["thread"].is_number_integer());
  }
  EXPECT_GT(log_lines, 10);
}

TEST(ServiceOps, UsageErrorsExitTwoBeforeTheModelLoads) {
  test::TempDir dir;
  const std::string db = (dir.path() / "jobs.db").string();
  const std::vector<std::string> serve = {"serve", "--db", db, "--model",
                                          (dir.path() / "no-model").string()};
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--log-format", "xml"}, "unknown log format 'xml'"},
      {{"--log-level", "loud"}, "unknown log level 'loud'"},
      {{"--restart-at", "0 3 31 2 *"}, "no month of the expression has that day"},
      {{"--restart-at", "0 3 * * fri-mon"}, "runs backwards"},
      {{"--metrics-port", "70000"}, "metrics_port"},
      {{"--log-stats-interval-s", "-1"}, "log_stats_interval_s"},
      {{"--bind", "tcp:/127.0.0.1:5555"}, "is not a ZeroMQ endpoint"},
      {{"--max-num-seqs", "many"}, "max-num-seqs"},
      // Accepted: what fails is the missing model, not the schedule.
      {{"--restart-at", "0 3 * * 1-5"}, "no-model"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = serve;
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const test::RunResult r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << c.extra[0] << " " << c.extra[1] << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  // --log-level and --log-format before or after any subcommand.
  EXPECT_EQ(
      test::run_cli({"stats", "--db", db, "--log-level", "warn", "--log-format", "json"}).exit_code,
      0);
  EXPECT_EQ(test::run_cli({"--log-level", "loud", "stats", "--db", db}).exit_code, 2);
}

}  // namespace
}  // namespace moebatch
