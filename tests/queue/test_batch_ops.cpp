// The batch operations of JobStore (counts, cancel, retry of the failed jobs, purge of a
// finished batch), the latency record of one job, and `user` / `metadata` stored with a job, on
// a real SQLite file and on a real PostgreSQL database (every test runs on both).
#include <gtest/gtest.h>

#include "queue/job_store.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;
using test::store_options;

constexpr int64_t kT0 = 1'800'000'000'000;

class BatchOpsTest : public test::StoreKindTest {
 protected:
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>(kT0);
  JobStore store{store_options(location(), clock)};

  // n jobs of batch b, keys b/0, b/1, ...
  std::vector<int64_t> submit_batch(const std::string& b, int n) {
    std::vector<JobSpec> specs;
    for (int i = 0; i < n; ++i) {
      JobSpec s = test::text_job("p" + std::to_string(i), b + "/" + std::to_string(i));
      s.batch_id = b;
      specs.push_back(s);
    }
    std::vector<int64_t> ids;
    for (const SubmitResult& r : store.submit_many(specs)) ids.push_back(r.id);
    return ids;
  }
  // Claims every queued job of the store and gives each its outcome: done (3 prompt + 2
  // completion tokens), failed for good, or left running.
  void run_one(int64_t id, const char* outcome) {
    auto claimed = store.claim("w", 1, milliseconds(60000));
    ASSERT_EQ(claimed.size(), 1u);
    ASSERT_EQ(claimed[0].id, id);
    if (std::string(outcome) == "done") {
      ASSERT_TRUE(store.complete("w", id, {"out", 3, 2, "stop", {}}, {4, 5, 6, 15, 333.0}));
    } else if (std::string(outcome) == "failed") {
      ASSERT_EQ(store.fail("w", id, "boom", false), FailOutcome::Failed);
    }
  }
};

MB_INSTANTIATE_STORE_TESTS(BatchOpsTest);

TEST_P(BatchOpsTest, CountsAreThoseOfTheBatchAlone) {
  auto ids = submit_batch("a", 4);
  submit_batch("other", 2);
  run_one(ids[0], "done");
  clock->advance(10);
  run_one(ids[1], "failed");
  run_one(ids[2], "running");
  BatchCounts c = store.batch_counts("a");
  EXPECT_EQ(c.total, 4);
  EXPECT_EQ(c.counts.at(JobState::Done), 1);
  EXPECT_EQ(c.counts.at(JobState::Failed), 1);
  EXPECT_EQ(c.counts.at(JobState::Running), 1);
  EXPECT_EQ(c.counts.at(JobState::Queued), 1);
  EXPECT_EQ(c.counts.at(JobState::Cancelled), 0);
  EXPECT_EQ(c.unfinished(), 2);
  EXPECT_EQ(c.prompt_tokens, 3);
  EXPECT_EQ(c.completion_tokens, 2);
  EXPECT_EQ(c.first_enqueued_at, kT0);
  EXPECT_EQ(c.last_finished_at, kT0 + 10);
  BatchCounts none = store.batch_counts("missing");
  EXPECT_EQ(none.total, 0);
  EXPECT_EQ(none.counts.size(), 5u);
  EXPECT_FALSE(none.first_enqueued_at);
}

TEST_P(BatchOpsTest, CancelTakesQueuedAndRunningAndLeavesFinalJobs) {
  auto ids = submit_batch("a", 3);
  auto other = submit_batch("b", 1);
  run_one(ids[0], "done");
  run_one(ids[1], "running");
  EXPECT_EQ(store.cancel_batch("a"), 2);
  EXPECT_EQ(store.get(ids[0])->state, JobState::Done);
  EXPECT_EQ(store.get(ids[1])->state, JobState::Cancelled);
  EXPECT_EQ(store.get(ids[2])->state, JobState::Cancelled);
  EXPECT_EQ(store.get(other[0])->state, JobState::Queued);
  // The worker of the cancelled running job lost its lease.
  EXPECT_FALSE(store.complete("w", ids[1], {"late", 1, 1, "stop", {}}, {}));
  EXPECT_EQ(store.cancel_batch("a"), 0);
}

TEST_P(BatchOpsTest, RetryRequeuesOnlyFailedJobsWithFreshAttempts) {
  auto ids = submit_batch("a", 3);
  run_one(ids[0], "done");
  run_one(ids[1], "failed");
  store.cancel(ids[2]);
  clock->advance(100);
  EXPECT_EQ(store.retry_batch("a"), 1);
  Job j = *store.get(ids[1]);
  EXPECT_EQ(j.state, JobState::Queued);
  EXPECT_EQ(j.attempts, 0);
  EXPECT_FALSE(j.error);
  EXPECT_FALSE(j.finished_at);
  EXPECT_EQ(store.get(ids[2])->state, JobState::Cancelled);
  // Claimable at once, and it can now finish.
  run_one(ids[1], "done");
  EXPECT_EQ(store.batch_counts("a").counts.at(JobState::Done), 2);
  EXPECT_EQ(store.retry_batch("a"), 0);
}

TEST_P(BatchOpsTest, PurgeRefusesWhileJobsAreUnfinishedThenDeletesTheBatch) {
  auto ids = submit_batch("a", 2);
  auto other = submit_batch("b", 1);
  run_one(ids[0], "done");
  PurgeOutcome p = store.purge_batch("a");
  EXPECT_EQ(p.deleted, 0);
  EXPECT_EQ(p.unfinished, 1);
  EXPECT_TRUE(store.get(ids[0]));
  store.cancel(ids[1]);
  p = store.purge_batch("a");
  EXPECT_EQ(p.deleted, 2);
  EXPECT_EQ(p.unfinished, 0);
  EXPECT_FALSE(store.get(ids[0]));
  EXPECT_FALSE(store.latency(ids[0]));
  EXPECT_EQ(store.batch_counts("a").total, 0);
  EXPECT_TRUE(store.get(other[0]));
  // The latency rows went with their jobs: the queue's statistics no longer count them.
  EXPECT_EQ(store.stats().total_ms.count, 0);
  // The keys are free again: the same request can be imported anew.
  JobSpec again = test::text_job("p0", "a/0");
  again.batch_id = "a";
  EXPECT_TRUE(store.submit(again).created);
}

TEST_P(BatchOpsTest, LatencyRecordOfADoneJob) {
  auto ids = submit_batch("a", 2);
  run_one(ids[0], "done");
  auto l = store.latency(ids[0]);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->queue_wait_ms, 4);
  EXPECT_EQ(l->ttft_ms, 5);
  EXPECT_EQ(l->decode_ms, 6);
  EXPECT_EQ(l->total_ms, 15);
  EXPECT_DOUBLE_EQ(*l->tokens_per_s, 333.0);
  EXPECT_FALSE(store.latency(ids[1]));
}

TEST_P(BatchOpsTest, UserAndMetadataAreStoredAndPartOfThePayload) {
  JobSpec s = test::text_job("p", "k");
  s.user = "user-17";
  s.metadata = R"({"team":"docs"})";
  const int64_t id = store.submit(s).id;
  Job j = *store.get(id);
  EXPECT_EQ(j.spec.user, "user-17");
  EXPECT_EQ(j.spec.metadata, R"({"team":"docs"})");
  EXPECT_FALSE(store.submit(s).created);
  s.metadata = R"({"team":"ops"})";
  EXPECT_THROW(store.submit(s), KeyConflictError);
  s.metadata = R"({"team":1})";
  s.client_key = "k2";
  EXPECT_THROW(store.submit(s), InputError);
  s.metadata = R"(["x"])";
  EXPECT_THROW(store.submit(s), InputError);
}

}  // namespace
}  // namespace moebatch
