// Several hosts on one PostgreSQL database: three real `moebatch serve` processes on the demo
// model (CPU) drain one queue while producers insert through JobStore (queue_helper), plain
// SQL (queue_helper) and the ZeroMQ ingress of one daemon. Midway one daemon is SIGKILLed and
// another SIGSTOPped past its lease, then continued; then `moebatch maintenance --now` is
// taken by exactly one of the two left. At the end every job is final exactly once (one final
// event each), with one result and one latency row, and nothing is leased.
//
// 3,000 jobs by default (about 30 s on a shared 2-core machine); MOEBATCH_MULTIHOST_JOBS
// changes the count (at least 30, rounded down to a multiple of 3).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <thread>

#include "queue/job_store.h"
#include "queue/zmq/client.h"
#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/common/wait.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;

constexpr int kLeaseS = 3;     // short, so the paused daemon loses its leases quickly
constexpr int kMaxTokens = 1;  // the queue is under test, not the engine

int64_t job_count() {
  const char* v = std::getenv("MOEBATCH_MULTIHOST_JOBS");
  const int64_t n = v ? std::atoll(v) : 3000;
  return n >= 30 ? n - n % 3 : 3000;
}

/// One `moebatch serve` on the shared database, with its ZeroMQ ingress on a free port.
struct Host {
  test::Child child;
  nlohmann::json ports;
  Host(const std::string& db, const std::filesystem::path& log)
      : child(test::join_args({{test::moebatch_bin(),
                                "serve",
                                "--db",
                                db,
                                "--bind",
                                "tcp://127.0.0.1:*",
                                "--http-port",
                                "0",
                                "--poll-ms",
                                "20",
                                "--lease-s",
                                std::to_string(kLeaseS),
                                "--max-num-seqs",
                                "16",
                                "--max-num-batched-tokens",
                                "256",
                                "--kv-cache-mb",
                                "16",
                                "--warmup-seqs",
                                "1",
                                "--threads",
                                "1"},
                               test::demo_model_flags()}),
              log) {}
  bool ready() {
    return test::wait_until(
        [&] {
          const auto line = test::ready_line(child.read_log());
          if (line) ports = *line;
          return line.has_value();
        },
        60s);
  }
};

TEST(MultiHost, ThreeServesDrainOneDatabaseThroughAKillAndAPause) {
  MB_SKIP_UNDER_TSAN("three daemons draining 3,000 jobs exceed ctest's 300 s");
  const int64_t n = job_count();
  test::TempDir dir;
  test::PgTestDatabase pg;
  const std::string db = pg.url();
  { JobStore migrate(test::store_options(db)); }
  std::vector<std::unique_ptr<Host>> hosts;
  for (int i = 0; i < 3; ++i)
    hosts.push_back(
        std::make_unique<Host>(db, dir.path() / ("serve" + std::to_string(i) + ".log")));
  for (auto& h : hosts) ASSERT_TRUE(h->ready()) << h->child.read_log();
  const auto t0 = std::chrono::steady_clock::now();

  // Producers, a third each, while the hosts drain.
  const std::string third = std::to_string(n / 3);
  test::Child api(
      {QUEUE_HELPER_BIN, "produce", db, "mh-api", third, "50", std::to_string(kMaxTokens)});
  test::Child sql(
      {QUEUE_HELPER_BIN, "produce-sql", db, "mh-sql", third, "50", std::to_string(kMaxTokens)});
  std::thread zmq([&] {
    zmq_ingress::ClientOptions co;
    co.endpoint = hosts[0]->ports["router"].get<std::string>();
    co.timeout = 10s;
    zmq_ingress::LazyPirateClient client(co);
    std::vector<JobSpec> specs;
    for (int64_t i = 0; i < n / 3; ++i) {
      JobSpec s = test::text_job("zmq prompt " + std::to_string(i), "mh-zmq-" + std::to_string(i));
      s.batch_id = "mh-zmq";
      s.sampling.max_tokens = kMaxTokens;
      s.sampling.temperature = 0;
      specs.push_back(std::move(s));
    }
    client.submit_jobs(std::move(specs), 50);
  });

  test::SideConnection side(db);
  auto count = [&](const std::string& where) {
    return side.query_i64("SELECT count(*) FROM jobs WHERE " + where);
  };
  // Host 1 dies with leases held; host 2 stalls past its lease and comes back.
  ASSERT_TRUE(test::wait_until([&] { return count("state = 'done'") >= n / 4; }, 120s));
  hosts[1]->child.signal(SIGKILL);
  hosts[2]->child.signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(kLeaseS) + 1500ms);
  hosts[2]->child.signal(SIGCONT);
  // An operator request reaches the daemons by NOTIFY; one takes it and runs a cycle.
  const test::RunResult m = test::run_cli({"maintenance", "--now", "--db", db});
  EXPECT_EQ(m.exit_code, 0) << m.err;

  EXPECT_EQ(api.wait(), 0);
  EXPECT_EQ(sql.wait(), 0);
  zmq.join();
  // What a stuck drain looks like from the database and from each daemon's log.
  auto diagnosis = [&] {
    std::string d = std::to_string(count("state = 'queued'")) + " queued, " +
                    std::to_string(count("state = 'running'")) + " running, of which " +
                    std::to_string(count("state = 'running' AND lease_expires_at < "
                                         "(extract(epoch FROM clock_timestamp()) * 1000)::bigint")) +
                    " past their lease\n";
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string log = hosts[i]->child.read_log();
      d += "--- serve" + std::to_string(i) + " log (last 4000 bytes):\n" +
           log.substr(log.size() > 4000 ? log.size() - 4000 : 0) + "\n";
    }
    return d;
  };
  ASSERT_TRUE(test::wait_until(
      [&] { return count("state IN ('done', 'failed', 'cancelled')") == n; }, 180s))
      << diagnosis();
  const double drain_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // One cycle for the one request, by one daemon.
  EXPECT_TRUE(test::wait_until(
      [&] { return side.query_i64("SELECT count(*) FROM service_cycles") == 1; }, 30s));
  for (int i : {0, 2}) {
    hosts[static_cast<size_t>(i)]->child.signal(SIGTERM);
    EXPECT_EQ(hosts[static_cast<size_t>(i)]->child.wait_for(30s), 0)
        << hosts[static_cast<size_t>(i)]->child.read_log().substr(0, 4000);
  }

  EXPECT_EQ(count("true"), n);
  EXPECT_EQ(count("state = 'done'"), n) << "every job done";
  EXPECT_EQ(count("state = 'done' AND result_text IS NOT NULL AND completion_tokens >= 1"), n);
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM job_latency"), n) << "one latency row each";
  EXPECT_EQ(count("lease_owner IS NOT NULL AND state = 'running'"), 0) << "nothing leased";
  // One final transition per job (the daemons' final-event log): none reached a final state
  // twice, whichever host wrote it.
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM service_final_events"), n);
  EXPECT_EQ(side.query_i64("SELECT count(DISTINCT job_id) FROM service_final_events"), n);
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM service_cycles"), 1) << "one request, one cycle";
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM service_cycles WHERE trigger = 'request' AND "
                           "result = 'ok'"),
            1);
  EXPECT_EQ(side.query_i64("SELECT count(*) FROM service_requests WHERE taken_by IS NOT NULL"), 1);
  // The kill and the pause mattered: some jobs ran again elsewhere.
  EXPECT_GT(count("attempts > 1"), 0) << "no job was taken over from the dead or paused host";
  std::printf("multi-host: %lld jobs drained in %.1f s; %lld ran more than once\n",
              static_cast<long long>(n), drain_s, static_cast<long long>(count("attempts > 1")));
}

}  // namespace
}  // namespace moebatch
