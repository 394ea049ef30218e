// The service as a real process (tests/service/service_daemon, the flags of `moebatch serve`):
// CLI submit → done; SIGTERM drains and exits 0; repeated SIGKILL mid-batch while a producer
// keeps submitting leaves every acked job with exactly one final result; `moebatch maintenance
// --now` runs a cycle, and one over a corrupted model copy fails without taking the engine down.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "engine/device_query.h"
#include "queue/job_store.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;

struct Daemon {
  std::filesystem::path dir, db, ready;
  std::vector<std::string> extra;
  std::filesystem::path model = test::demo_model();

  std::vector<std::string> args() const {
    std::vector<std::string> a = {SERVICE_DAEMON_BIN,
                                  "--db",
                                  db.string(),
                                  "--model",
                                  model.string(),
                                  "--ready-file",
                                  ready.string(),
                                  "--http-port",
                                  "0",
                                  "--max-num-seqs",
                                  "8",
                                  "--max-num-batched-tokens",
                                  "512",
                                  "--kv-cache-mb",
                                  "16",
                                  "--poll-ms",
                                  "10",
                                  "--warmup-seqs",
                                  "1",
                                  "--threads",
                                  "2",
                                  "--tokenizer",
                                  test::test_data_dir() + "/qwen3-tokenizer"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  test::Child start(int n = 0) {
    std::filesystem::remove(ready);
    return test::Child(args(), dir / ("daemon" + std::to_string(n) + ".log"));
  }
};

Daemon make_daemon(const std::filesystem::path& dir) {
  Daemon d;
  d.dir = dir;
  d.db = dir / "jobs.db";
  d.ready = dir / "ready.json";
  return d;
}

JobStore open_store(const std::filesystem::path& db) { return JobStore(test::store_options(db)); }

/// n greedy jobs "<prefix> i" of max_tokens each, submitted in one transaction.
void submit_greedy(const std::filesystem::path& db, size_t n, const std::string& prefix,
                   int64_t max_tokens) {
  std::vector<JobSpec> specs(n);
  for (size_t i = 0; i < n; ++i) {
    specs[i].prompt = prefix + " " + std::to_string(i);
    specs[i].sampling.max_tokens = max_tokens;
    specs[i].sampling.temperature = 0;  // greedy: the CPU sampler is cheap then
  }
  open_store(db).submit_many(specs);
}

int64_t count(const std::filesystem::path& db, const std::string& where) {
  return test::query_i64(db, "SELECT count(*) FROM jobs WHERE " + where);
}

TEST(ServiceProcess, CliSubmitToResultAndHttpEndpoints) {
  test::TempDir dir;
  Daemon d = make_daemon(dir.path());
  test::Child c = d.start();
  auto ready = test::wait_ready(d.ready, 60s);
  ASSERT_TRUE(ready) << c.read_log();
  auto submit = test::run_cli(
      {"submit", "--db", d.db.string(), "Hello service", "--max-tokens", "5", "--json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  ASSERT_TRUE(test::wait_until([&] { return count(d.db, "state = 'done'") == 1; }, 30s))
      << c.read_log();
  auto result = test::run_cli({"result", "--db", d.db.string(), "1"});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(test::query_i64(d.db, "SELECT count(*) FROM job_latency WHERE job_id = 1"), 1);
  const int port = (*ready)["http_port"].get<int>();
  EXPECT_EQ(test::http_get(port, "/health").first, 200);
  const auto [ms, metrics] = test::http_get(port, "/metrics");
  EXPECT_EQ(ms, 200);
  EXPECT_NE(metrics.find("moebatch_jobs_done_total 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("moebatch_engine_up 1"), std::string::npos);
  c.signal(SIGTERM);
  EXPECT_EQ(c.wait_for(30s), 0) << c.read_log();
  // The start log names the effective config and the memory budget.
  const std::string log = c.read_log();
  EXPECT_NE(log.find("effective config"), std::string::npos);
  EXPECT_NE(log.find("KV cache holds"), std::string::npos);
}

TEST(ServiceProcess, SigtermDrainsCleanlyAndExitsZero) {
  test::TempDir dir;
  Daemon d = make_daemon(dir.path());
  d.extra = {"--shutdown-timeout-s", "20"};
  submit_greedy(d.db, 40, "drain me", 24);
  test::Child c = d.start();
  ASSERT_TRUE(test::wait_ready(d.ready, 60s)) << c.read_log();
  ASSERT_TRUE(test::wait_until([&] { return count(d.db, "state = 'running'") > 0; }, 30s));
  c.signal(SIGTERM);
  EXPECT_EQ(c.wait_for(30s), 0) << c.read_log();
  // Nothing left leased: each job is done or back in the queue, none running.
  EXPECT_EQ(count(d.db, "state = 'running' OR lease_owner IS NOT NULL"), 0);
  EXPECT_EQ(count(d.db, "state IN ('done', 'queued')"), 40);
  EXPECT_EQ(count(d.db, "attempts > 1"), 0);
  // A second run finishes the rest (under TSan: ~20 s to start, then ~0.8 jobs/s).
  test::Child c2 = d.start(1);
  ASSERT_TRUE(
      test::wait_until([&] { return count(d.db, "state = 'done'") == 40; }, test::under_tsan(60s)))
      << c2.read_log();
  c2.signal(SIGINT);
  EXPECT_EQ(c2.wait_for(30s), 0);
}

TEST(ServiceProcess, RepeatedSigkillMidBatchLeavesExactlyOneResultPerAckedJob) {
  MB_SKIP_UNDER_TSAN("21 daemon starts (~20 s each) and the last run's share exceed ctest's 300 s");
  test::TempDir dir;
  Daemon d = make_daemon(dir.path());
  d.extra = {"--lease-s", "1"};
  { open_store(d.db); }
  // Producer: keeps submitting through its own connection; a job is acked when submit returns.
  // It holds back while kBacklog jobs wait, so every incarnation has work to be killed in the
  // middle of, and the last run's share follows the service's pace rather than the time the
  // kill cycles took (several times longer under a sanitizer).
  constexpr int64_t kBacklog = 40;
  std::atomic<bool> producing{true};
  std::atomic<int64_t> acked{0};
  std::thread producer([&] {
    JobStore store = open_store(d.db);
    int64_t i = 0;
    while (producing) {
      if (count(d.db, "state = 'queued'") >= kBacklog) {
        std::this_thread::sleep_for(40ms);
        continue;
      }
      JobSpec s;
      s.prompt = "kill test " + std::to_string(i);
      s.client_key = "k" + std::to_string(i++);
      s.sampling.max_tokens = 4;
      s.sampling.temperature = 0;
      s.max_attempts = 100;  // survive many crashes: we check the result, not attempt limits
      store.submit(s);
      ++acked;
      std::this_thread::sleep_for(40ms);
    }
  });
  const int cycles = 20;
  int killed_mid_batch = 0;
  for (int k = 0; k < cycles; ++k) {
    test::Child c = d.start(k);
    ASSERT_TRUE(test::wait_ready(d.ready, 60s)) << c.read_log();
    // Kill once this incarnation holds leases (mid-batch), or after a short while.
    const std::string mine = test::wait_ready(d.ready, 1s)->at("worker").get<std::string>();
    if (test::wait_until([&] { return count(d.db, "lease_owner = '" + mine + "'") > 0; }, 1500ms))
      ++killed_mid_batch;
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + 20 * (k % 5)));
    c.signal(SIGKILL);
    EXPECT_EQ(c.wait_for(10s), -SIGKILL);
  }
  producing = false;
  producer.join();
  EXPECT_GE(killed_mid_batch, cycles / 2);
  // A last, undisturbed run finishes everything once the dead incarnations' leases expire. It
  // fails when no job finishes for a whole minute, not after a fixed window: a slower build
  // (ASan, TSan) only takes longer.
  test::Child last = d.start(cycles);
  int64_t done = -1;
  bool progressing = true;
  while (progressing && done != acked.load()) {
    const int64_t before = done;
    progressing = test::wait_until(
        [&] {
          done = count(d.db, "state = 'done'");
          return done > before;
        },
        60s);
  }
  ASSERT_EQ(done, acked.load()) << "no job finished for 60 s: done " << done << " of "
                                << acked.load() << ", failed " << count(d.db, "state = 'failed'")
                                << ", queued " << count(d.db, "state = 'queued'") << ", running "
                                << count(d.db, "state = 'running'") << "\n"
                                << last.read_log();
  last.signal(SIGTERM);
  EXPECT_EQ(last.wait_for(30s), 0);
  EXPECT_EQ(count(d.db, "1"), acked.load());
  EXPECT_EQ(test::query_i64(d.db, "SELECT count(*) FROM job_latency"), acked.load());
  EXPECT_EQ(count(d.db, "result_text IS NULL"), 0);
}

TEST(ServiceProcess, MaintenanceNowRunsACycleAndACorruptModelKeepsTheOldEngine) {
  test::TempDir dir;
  // A private copy of the model, so the test can break it under the running daemon.
  const auto model = dir.path() / "model";
  std::filesystem::copy(test::demo_model(), model);
  Daemon d = make_daemon(dir.path());
  d.model = model;
  d.extra = {"--drain-timeout-s", "5"};
  submit_greedy(d.db, 24, "maint", 8);
  test::Child c = d.start();
  auto ready = test::wait_ready(d.ready, 60s);
  ASSERT_TRUE(ready) << c.read_log();
  auto maint = test::run_cli({"maintenance", "--now", "--db", d.db.string()});
  ASSERT_EQ(maint.exit_code, 0) << maint.out << maint.err;
  ASSERT_TRUE(test::wait_until(
      [&] { return test::query_i64(d.db, "SELECT count(*) FROM service_cycles") == 1; }, 30s))
      << c.read_log();
  EXPECT_EQ(test::query_i64(d.db,
                            "SELECT count(*) FROM service_cycles WHERE result = 'ok' AND "
                            "trigger = 'request' AND mem_after > 0"),
            1);
  ASSERT_TRUE(test::wait_until([&] { return count(d.db, "state = 'done'") == 24; }, 60s));
  EXPECT_EQ(test::query_i64(d.db, "SELECT count(*) FROM job_latency"), 24);

  // Corrupt the checkpoint (a truncated copy), then ask for another cycle: the model check
  // finds it before the old engine is torn down, so the cycle is recorded as failed with the
  // reason and the daemon keeps serving on the engine it had.
  const auto weights = model / "model.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) / 2);
  auto again = test::run_cli({"maintenance", "--now", "--db", d.db.string()});
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  ASSERT_TRUE(test::wait_until(
      [&] { return test::query_i64(d.db, "SELECT count(*) FROM service_cycles") == 2; }, 30s))
      << c.read_log();
  EXPECT_EQ(test::query_i64(d.db,
                            "SELECT count(*) FROM service_cycles WHERE result = 'failed' AND "
                            "error LIKE '%model check failed%model.safetensors%'"),
            1)
      << test::query_text(d.db, "SELECT error FROM service_cycles ORDER BY id DESC");
  const int port = (*ready)["http_port"].get<int>();
  EXPECT_EQ(test::http_get(port, "/health").first, 200);
  submit_greedy(d.db, 4, "after the failed cycle", 4);
  ASSERT_TRUE(test::wait_until([&] { return count(d.db, "state = 'done'") == 28; }, 30s))
      << c.read_log();
  EXPECT_NE(
      test::http_get(port, "/metrics").second.find("moebatch_restarts_total{result=\"failed\"} 1"),
      std::string::npos);
  auto listing = test::run_cli({"maintenance", "--db", d.db.string()});
  EXPECT_EQ(listing.exit_code, 0);
  EXPECT_NE(listing.out.find("failed"), std::string::npos) << listing.out << listing.err;
  c.signal(SIGTERM);
  EXPECT_EQ(c.wait_for(30s), 0) << c.read_log();
}

TEST(ServiceProcess, ServeRunsTheEngineBehindTheZeroMqIngress) {
  test::TempDir dir;
  const auto db = dir.path() / "jobs.db";
  test::Child c(test::join_args({{test::moebatch_bin(), "serve", "--db", db.string(), "--model",
                                  test::demo_model().string(), "--bind", "tcp://127.0.0.1:*",
                                  "--pub", "tcp://127.0.0.1:*", "--http-port", "0"},
                                 test::small_engine_flags(4)}),
                dir.path() / "serve.log");
  std::string router;
  ASSERT_TRUE(test::wait_until(
      [&] {
        const std::string log = c.read_log();
        const auto p = log.find("{\"http_port\"");
        if (p == std::string::npos) return false;
        router = nlohmann::json::parse(log.substr(p, log.find('\n', p) - p))["router"];
        return true;
      },
      60s))
      << c.read_log();
  auto submit = test::run_cli(
      {"submit", "--endpoint", router, "Hi over ZMQ", "--max-tokens", "3", "--temperature", "0"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  EXPECT_TRUE(test::wait_until([&] { return count(db, "state = 'done'") == 1; }, 30s))
      << c.read_log();
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM job_latency"), 1);
  c.signal(SIGTERM);
  EXPECT_EQ(c.wait_for(30s), 0) << c.read_log();
}

// `moebatch demo` runs the service with the ZeroMQ ingress in front and submits through both
// producers; the table counts each way, and the resent ZeroMQ message creates no second job.
TEST(ServiceProcess, DemoSubmitsThroughSqlAndZeroMqAndFinishesEveryJob) {
  test::TempDir dir;
  test::demo_model();  // generated into the test cache, which the demo reads through the env
  setenv("MOEBATCH_CACHE", MOEBATCH_TEST_CACHE, 1);
  const auto db = dir.path() / "demo.db";
  // A deadline for work to finish (under TSan the demo's engine warms up and generates several
  // times slower); ctest's 300 s per-test limit stays above the scaled bound.
  auto demo = test::run_cli({"demo", "--jobs", "24", "--max-tokens", "4", "--threads", "2", "--db", db.string()},
                            test::kThreadSanitizer ? std::chrono::milliseconds(240'000) : std::chrono::milliseconds(60'000));
  ASSERT_EQ(demo.exit_code, 0) << demo.out << demo.err;
  const std::string& out = demo.out;
  EXPECT_NE(out.find("12 by SQL INSERT"), std::string::npos) << out;
  EXPECT_NE(out.find("12 over ZeroMQ"), std::string::npos) << out;
  EXPECT_NE(out.find("came back as known: yes"), std::string::npos) << out;
  EXPECT_EQ(count(db, "batch_id = 'demo-sql' AND state = 'done'"), 12);
  EXPECT_EQ(count(db, "batch_id = 'demo-zmq' AND state = 'done'"), 12);
  EXPECT_EQ(count(db, "client_key LIKE 'demo-zmq-%'"), 12) << "the resent message made a job";
  EXPECT_EQ(count(db, "1"), 24);
  const auto p = out.find("jobs done");
  ASSERT_NE(p, std::string::npos) << out;
  EXPECT_EQ(std::stoi(out.substr(p + 9, out.find('\n', p) - p - 9)), 24) << out;
}

// Without a GPU (CI), or in a build without the CUDA backend, `serve --backend cuda` refuses to
// start: a configuration error with exit status 2 and a message naming the backend, before any
// socket is bound or job claimed.
TEST(ServiceProcess, BackendCudaWithoutAGpuFailsAtStartWithExitCode2) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu covers the real run";
  test::TempDir dir;
  const auto db = dir.path() / "jobs.db";
  auto serve =
      test::run_cli({"serve", "--db", db.string(), "--model", test::demo_model().string(), "--bind",
                     "tcp://127.0.0.1:*", "--http-port", "0", "--backend", "cuda"});
  EXPECT_EQ(serve.exit_code, 2) << serve.out << serve.err;
  EXPECT_NE(serve.err.find("backend cuda: "), std::string::npos) << serve.err;
  EXPECT_NE(serve.err.find(cuda_backend_built() ? "no CUDA device" : "no CUDA backend"),
            std::string::npos)
      << serve.err;
  // The same through the config file key.
  test::write_file(dir.path() / "svc.json",
                   R"({"backend": "cuda", "gpu_memory_utilization": 0.5})");
  auto daemon = test::run_command({SERVICE_DAEMON_BIN, "--db", db.string(), "--model",
                                   test::demo_model().string(), "--http-port", "0", "--config",
                                   dir.file("svc.json")});
  EXPECT_EQ(daemon.exit_code, 2) << daemon.out << daemon.err;
  EXPECT_NE(daemon.err.find("backend cuda: "), std::string::npos) << daemon.err;
  EXPECT_EQ(test::query_i64(db, "SELECT count(*) FROM jobs"), 0);
}

TEST(ServiceProcess, BadConfigIsRefusedWithExitCode2) {
  test::TempDir dir;
  Daemon d = make_daemon(dir.path());
  d.extra = {"--lease-s", "0"};
  test::Child c = d.start();
  EXPECT_EQ(c.wait_for(30s), 2);
  EXPECT_NE(c.read_log().find("lease_s"), std::string::npos) << c.read_log();
}

}  // namespace
}  // namespace moebatch
