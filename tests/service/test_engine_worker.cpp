// The engine thread's contract with the dispatcher about claims: a cancellation names one claim
// (its ticket), never a job, so when a job's lease is lost and the same daemon claims the job
// again, the cancellation of the old claim cannot stop the new one. Runs the real EngineWorker
// on the demo model (CPU).
#include <gtest/gtest.h>

#include "service/engine_worker.h"
#include "tests/common/files.h"
#include "tests/common/wait.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

using namespace std::chrono_literals;

WorkItem claim_of(int64_t job_id, Ticket ticket, int64_t max_tokens) {
  WorkItem w;
  w.job_id = job_id;
  w.ticket = ticket;
  w.prompt = {10, 11, 12, 13};
  w.max_tokens = max_tokens;
  w.claimed = std::chrono::steady_clock::now();
  return w;  // greedy, no stop ids: exactly max_tokens tokens
}

// Collects results until `n` arrived or `timeout` passed.
std::vector<WorkResult> results(EngineWorker& w, size_t n, std::chrono::milliseconds timeout) {
  std::vector<WorkResult> got;
  test::wait_until(
      [&] {
        for (WorkResult& r : w.take_results()) got.push_back(std::move(r));
        return got.size() >= n;
      },
      timeout);
  return got;
}

TEST(EngineWorker, ACancelledClaimNeverStopsTheSameJobsNextClaim) {
  test::TempDir dir;
  ServiceConfig c = test::demo_service_config(dir.path());
  c.max_num_seqs = 4;
  c.warmup_seqs = 0;
  EngineWorker worker(c, [] {});

  // The old claim is given up while its item waits in the hand-off, and the job is claimed
  // again at once: only the new claim runs, and it reports.
  ASSERT_TRUE(worker.input().try_push(claim_of(7, 1, 3)));
  worker.cancel({1});
  ASSERT_TRUE(worker.input().try_push(claim_of(7, 2, 3)));
  worker.start();
  std::vector<WorkResult> got = results(worker, 1, 60s);
  ASSERT_EQ(got.size(), 1u) << "the job's new claim was stopped with the old one";
  EXPECT_EQ(got[0].job_id, 7);
  EXPECT_EQ(got[0].ticket, 2u);
  EXPECT_EQ(got[0].outcome, WorkOutcome::Finished);
  EXPECT_EQ(got[0].tokens.size(), 3u);

  // The old claim is still generating when the job is claimed again: the engine holds both
  // for a moment under different ids, the old one is aborted, the new one finishes.
  ASSERT_TRUE(worker.input().try_push(claim_of(8, 3, 1000)));
  ASSERT_TRUE(test::wait_until([&] { return worker.counters().active.load() == 1; }, 60s));
  worker.cancel({3});
  ASSERT_TRUE(worker.input().try_push(claim_of(8, 4, 5)));
  got = results(worker, 1, 60s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job_id, 8);
  EXPECT_EQ(got[0].ticket, 4u);
  EXPECT_EQ(got[0].outcome, WorkOutcome::Finished);
  EXPECT_EQ(got[0].tokens.size(), 5u);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(worker.take_results().empty()) << "the aborted claim reported";
  EXPECT_EQ(worker.counters().active.load(), 0);
}

}  // namespace
}  // namespace moebatch
