// Real processes against one database (a SQLite file, and a PostgreSQL database): concurrent
// producers (JobStore and plain SQL) while a claimer drains the queue, and a worker killed with
// SIGKILL while holding leases.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "queue/job_store.h"
#include "tests/common/files.h"
#include "tests/common/subprocess.h"
#include "tests/queue/pg_test_util.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;
using test::Child;
using test::store_options;

std::vector<std::string> helper(std::vector<std::string> args) {
  args.insert(args.begin(), QUEUE_HELPER_BIN);
  return args;
}

class Processes : public test::StoreKindTest {};

MB_INSTANTIATE_STORE_TESTS(Processes);

TEST_P(Processes, ConcurrentProducersLoseNothingAndDuplicateNothing) {
  const std::string db = location();
  JobStore store(store_options(db, std::make_shared<SystemClock>()));
  constexpr int kPerProducer = 400;
  std::vector<std::unique_ptr<Child>> producers;
  for (int p = 0; p < 4; ++p) {
    const char* mode = p % 2 == 0 ? "produce" : "produce-sql";
    producers.push_back(std::make_unique<Child>(
        helper({mode, db, "p" + std::to_string(p), std::to_string(kPerProducer), "20"})));
  }
  // Drain while they insert: claim and complete, polling data_version to skip idle claims.
  std::map<int64_t, int> completions;
  int64_t seen_version = -1;
  int exited = 0;
  int statuses_ok = 0;
  auto drain = [&] {
    for (;;) {
      auto jobs = store.claim("drainer", 32, milliseconds(60000));
      if (jobs.empty()) return;
      std::vector<Completion> cs;
      for (const Job& j : jobs)
        cs.push_back({j.id, JobResult{"r:" + j.spec.prompt, 1, 1, "stop", {}}, {}});
      auto ok = store.complete_many("drainer", cs);
      for (size_t i = 0; i < ok.size(); ++i) {
        if (ok[i]) ++completions[cs[i].id];
      }
    }
  };
  while (exited < static_cast<int>(producers.size())) {
    int64_t v = store.data_version();
    if (v != seen_version) {
      seen_version = v;
      drain();
    }
    for (auto& p : producers) {
      if (p && !p->read_line(5).empty()) {
        statuses_ok += p->wait() == 0;
        p.reset();
        ++exited;
      }
    }
  }
  drain();
  EXPECT_EQ(statuses_ok, 4);
  const int total = 4 * kPerProducer;
  ASSERT_EQ(static_cast<int>(completions.size()), total);
  for (const auto& [id, n] : completions) EXPECT_EQ(n, 1) << "job " << id;
  QueueStats st = store.stats();
  EXPECT_EQ(st.counts[JobState::Done], total);
  EXPECT_EQ(st.counts[JobState::Queued], 0);
  std::set<std::string> keys;
  ListFilter f;
  f.limit = 100000;
  for (const Job& j : store.list(f)) {
    keys.insert(*j.spec.client_key);
    EXPECT_EQ(j.result->text, "r:" + j.spec.prompt);
    EXPECT_EQ(j.attempts, 1);
  }
  EXPECT_EQ(static_cast<int>(keys.size()), total);
}

TEST_P(Processes, KilledWorkersJobsRunAgainWithExactlyOneResult) {
  const std::string db = location();
  auto clock = std::make_shared<ManualClock>(SystemClock().now_ms());
  JobStore store(store_options(db, clock));
  std::vector<JobSpec> specs;
  for (int i = 0; i < 10; ++i) specs.push_back(test::text_job("job " + std::to_string(i)));
  store.submit_many(specs);

  constexpr int kLeaseMs = 3000;
  Child worker(helper({"hold", db, "doomed", "6", std::to_string(kLeaseMs)}));
  std::string line = worker.read_line();
  ASSERT_EQ(line.rfind("claimed 6", 0), 0u) << "helper said: '" << line << "'";
  std::set<int64_t> held;
  {
    std::istringstream in(line.substr(std::string("claimed 6").size()));
    int64_t id;
    while (in >> id) held.insert(id);
  }
  ASSERT_EQ(held.size(), 6u);
  worker.signal(SIGKILL);
  ASSERT_EQ(worker.wait(), -SIGKILL);

  // Before the lease ends only the 4 unleased jobs are available.
  auto first = store.claim("survivor", 100, milliseconds(60000));
  EXPECT_EQ(first.size(), 4u);
  for (const Job& j : first) EXPECT_FALSE(held.count(j.id));
  clock->advance(kLeaseMs + 1000);
  auto second = store.claim("survivor", 100, milliseconds(60000));
  ASSERT_EQ(second.size(), 6u);
  for (const Job& j : second) {
    EXPECT_TRUE(held.count(j.id));
    EXPECT_EQ(j.attempts, 2);
    EXPECT_EQ(j.error, "lease of doomed expired");
  }
  std::vector<Completion> cs;
  for (const auto* batch : {&first, &second}) {
    for (const Job& j : *batch)
      cs.push_back({j.id, JobResult{"survivor " + std::to_string(j.id), 1, 1, "stop", {}}, {}});
  }
  auto ok = store.complete_many("survivor", cs);
  EXPECT_EQ(std::count(ok.begin(), ok.end(), true), 10);
  // Had the dead worker come back, it could not overwrite anything.
  for (int64_t id : held) {
    EXPECT_FALSE(store.complete("doomed", id, JobResult{"ghost", 1, 1, "stop", {}}, {}));
  }
  EXPECT_EQ(store.stats().counts[JobState::Done], 10);
  for (const Job& j : store.list({})) {
    ASSERT_TRUE(j.result);
    EXPECT_EQ(j.result->text, "survivor " + std::to_string(j.id));
  }
}

}  // namespace
}  // namespace moebatch
