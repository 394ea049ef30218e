// The service tables on both databases (Stores/ServiceDbTest.*/sqlite|postgres): maintenance
// cycles, operator requests (one taker each, and a change notice for every daemon), the
// final-transition log (one row per final transition, whoever made it). PostgreSQL only
// (ServiceDbPg.*): final-event ids become visible in commit order, and a real lock_timeout is
// what StoreHealth treats as a held lock.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "queue/job_store.h"
#include "queue/pg_conn.h"
#include "service/service_db.h"
#include "tests/common/wait.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;
using ServiceDbTest = test::StoreKindTest;
MB_INSTANTIATE_STORE_TESTS(ServiceDbTest);

std::vector<int64_t> submit(JobStore& store, const std::vector<JobSpec>& specs) {
  std::vector<int64_t> ids;
  for (const SubmitResult& r : store.submit_many(specs)) ids.push_back(r.id);
  return ids;
}

TEST_P(ServiceDbTest, CyclesRoundTripAndEachRequestHasOneTakerAndWakesTheOthers) {
  JobStore jobs(test::store_options(location()));
  ServiceDb a(location()), b(location());
  CycleRecord c;
  c.worker = "host:1:2";
  c.trigger = "request";
  c.started_at = 10;
  c.ended_at = 20;
  c.downtime_ms = 9;
  c.drained = 3;
  c.requeued = 1;
  c.mem_before = 100;
  c.mem_after = 200;
  c.warmup_ms = 4;
  c.result = "failed";
  c.error = "model check failed";
  const int64_t id = a.record_cycle(c);
  const std::vector<CycleRecord> cycles = b.cycles();
  ASSERT_EQ(cycles.size(), 1u);
  EXPECT_EQ(cycles[0].id, id);
  EXPECT_EQ(cycles[0].worker, c.worker);
  EXPECT_EQ(cycles[0].downtime_ms, 9);
  EXPECT_EQ(cycles[0].mem_after, 200);
  EXPECT_EQ(cycles[0].error, c.error);

  // A daemon takes requests when its store's data_version moves: the insert must move it.
  const int64_t version = jobs.data_version();
  const int64_t req = a.add_request("maintenance", 1000);
  EXPECT_TRUE(test::wait_until([&] { return jobs.data_version() != version; }, 2s))
      << "a service request moved no daemon's data_version";
  EXPECT_EQ(b.take_request("maintenance", "w-b", 1001), std::optional<int64_t>(req));
  EXPECT_EQ(a.take_request("maintenance", "w-a", 1002), std::nullopt) << "taken twice";
  EXPECT_EQ(b.job_counts(),
            (std::map<std::string, int64_t>{
                {"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}, {"cancelled", 0}}));
}

TEST_P(ServiceDbTest, FinalLogHasOneRowPerFinalTransitionWhoeverMadeIt) {
  JobStore jobs(test::store_options(location()));
  ServiceDb daemon(location(), 5s, /*final_log=*/true);
  ServiceDb second(location(), 5s, /*final_log=*/true);  // a second daemon adds no 2nd trigger
  EXPECT_EQ(daemon.last_final_event(), 0);
  const std::vector<JobSpec> specs(4, test::text_job("p"));
  const std::vector<int64_t> ids = submit(jobs, specs);
  const std::vector<Job> claimed = jobs.claim("w", 2, 60s);
  ASSERT_EQ(claimed.size(), 2u);
  JobResult r;
  r.text = "out";
  r.completion_tokens = 2;
  ASSERT_TRUE(jobs.complete("w", ids[0], r, LatencyRecord{}));
  jobs.fail("w", ids[1], "boom", /*retryable=*/false);
  ASSERT_TRUE(jobs.cancel(ids[2]));
  EXPECT_FALSE(jobs.cancel(ids[2]));  // already final: no second row
  // A non-final change (a claim) writes nothing.
  ASSERT_EQ(jobs.claim("w", 1, 60s).size(), 1u);
  const std::vector<FinalEvent> events = second.final_events_after(0, 10);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].job_id, ids[0]);
  EXPECT_EQ(events[0].state, "done");
  EXPECT_EQ(events[1].job_id, ids[1]);
  EXPECT_EQ(events[1].state, "failed");
  EXPECT_NE(events[1].error.value_or("").find("boom"), std::string::npos);
  EXPECT_EQ(events[2].job_id, ids[2]);
  EXPECT_EQ(events[2].state, "cancelled");
  EXPECT_LT(events[0].seq, events[1].seq);
  EXPECT_LT(events[1].seq, events[2].seq);
  EXPECT_EQ(daemon.last_final_event(), events[2].seq);
  EXPECT_EQ(daemon.final_events_after(events[0].seq, 1).size(), 1u);
  EXPECT_EQ(daemon.final_events_after(events[2].seq, 10).size(), 0u);
  EXPECT_EQ(daemon.prune_final_events(3600), 0);
  EXPECT_EQ(daemon.prune_final_events(-10), 3);  // everything is older than "10 s from now"
  // Pruning never lets a new row reuse an id a reader has passed.
  ASSERT_TRUE(jobs.cancel(ids[3]));
  const std::vector<FinalEvent> after = daemon.final_events_after(events[2].seq, 10);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].job_id, ids[3]);
}

TEST_P(ServiceDbTest, ProducerSqlRunsInOneTransactionAndLatencyRowsAreRead) {
  JobStore jobs(test::store_options(location()));
  ServiceDb db(location());
  db.exec_producer_sql(
      "INSERT INTO jobs (client_key, prompt, max_tokens) VALUES ('a', 'it''s', 4);\n"
      "INSERT INTO jobs (client_key, prompt, max_tokens) VALUES ('b', 'x', 4);\n");
  EXPECT_EQ(jobs.get_by_key("a")->spec.prompt, "it's");
  // A failing statement rolls the whole script back.
  EXPECT_THROW(db.exec_producer_sql("INSERT INTO jobs (client_key, prompt) VALUES ('c', 'x');\n"
                                    "INSERT INTO jobs (client_key, prompt) VALUES ('a', 'dup');"),
               Error);
  EXPECT_FALSE(jobs.get_by_key("c"));
  const std::vector<Job> claimed = jobs.claim("w", 2, 60s);
  ASSERT_EQ(claimed.size(), 2u);
  JobResult r;
  r.completion_tokens = 3;
  LatencyRecord l;
  l.queue_wait_ms = 5;
  l.total_ms = 9;
  ASSERT_TRUE(jobs.complete("w", claimed[0].id, r, l));
  const LatencySamples s = db.latency_samples();
  ASSERT_EQ(s.wait.size(), 1u);
  EXPECT_EQ(s.wait[0], 5);
  EXPECT_EQ(s.total[0], 9);
  EXPECT_EQ(s.completion_tokens, 3);
}

// Without the advisory lock in the trigger, the second transaction would commit event id 2
// while id 1 is still open, and a reader at "after 2" would never see id 1.
TEST(ServiceDbPg, FinalEventIdsBecomeVisibleInCommitOrder) {
  test::PgTestDatabase pg;
  JobStore jobs(test::store_options(pg.url()));
  ServiceDb daemon(pg.url(), 5s, /*final_log=*/true);
  const std::vector<int64_t> ids = submit(jobs, {test::text_job("a"), test::text_job("b")});
  PgConn first(pg.url());
  first.exec("BEGIN");
  first.exec("UPDATE jobs SET state = 'cancelled' WHERE id = " + std::to_string(ids[0]));
  std::atomic<bool> second_committed{false};
  std::thread second([&] {
    PgConn c(pg.url());
    c.exec("BEGIN");
    c.exec("UPDATE jobs SET state = 'cancelled' WHERE id = " + std::to_string(ids[1]));
    c.exec("COMMIT");
    second_committed = true;
  });
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(second_committed) << "a later final transition committed before an earlier one";
  EXPECT_TRUE(daemon.final_events_after(0, 10).empty());
  first.exec("COMMIT");
  second.join();
  const std::vector<FinalEvent> events = daemon.final_events_after(0, 10);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].job_id, ids[0]);
  EXPECT_EQ(events[1].job_id, ids[1]);
  EXPECT_LT(events[0].seq, events[1].seq);
}

TEST(ServiceDbPg, ALockTimeoutIsAHeldLockAndALostSessionIsNot) {
  test::PgTestDatabase pg;
  ServiceDb db(pg.url(), 200ms);
  const int64_t req = db.add_request("maintenance", 1);
  PgConn holder(pg.url());
  holder.exec("BEGIN");
  holder.exec("SELECT * FROM service_requests WHERE id = " + std::to_string(req) + " FOR UPDATE");
  std::string error;
  try {
    db.take_request("maintenance", "w", 2);
  } catch (const Error& e) {
    error = e.what();
  }
  ASSERT_NE(error.find("55P03"), std::string::npos) << error;
  StoreHealth h(300);
  h.write_failed(error, 1000);
  EXPECT_TRUE(StoreHealth::is_lock_failure(error));
  EXPECT_FALSE(h.unwritable(1100)) << "a held lock gets the grace period";
  holder.exec("ROLLBACK");
  EXPECT_EQ(db.take_request("maintenance", "w", 3), std::optional<int64_t>(req));

  // The server drops the session: the next statement fails without a lock SQLSTATE, and the
  // one after it reconnects.
  const std::string others =
      "FROM pg_stat_activity WHERE datname = '" + pg.name() + "' AND pid <> pg_backend_pid()";
  holder.exec("SELECT pg_terminate_backend(pid) " + others);
  ASSERT_TRUE(test::wait_until(
      [&] { return holder.exec("SELECT count(*) " + others).i64(0, 0) == 0; }, 5s));
  error.clear();
  try {
    db.cycles();
  } catch (const Error& e) {
    error = e.what();
  }
  ASSERT_FALSE(error.empty()) << "the dropped session went unnoticed";
  EXPECT_FALSE(StoreHealth::is_lock_failure(error)) << error;
  EXPECT_NO_THROW(db.cycles());
}

}  // namespace
}  // namespace moebatch
