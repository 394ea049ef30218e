// See bench_workers.h. The queue is emptied with plain SQL between runs (DELETE on both
// databases), so every run starts from the same state; the clock is the wall clock (the drain
// is what several hosts would see), not CPU time.
#include "bench/queue/bench_workers.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "common/error.h"
#include "queue/job_store.h"
#include "queue/pg_conn.h"
#include "queue/sqlite_db.h"
#include "queue/store_url.h"

namespace moebatch::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

StoreOptions options(const std::string& location) {
  StoreOptions o;
  o.path = location;
  o.busy_timeout = std::chrono::seconds(30);  // SQLite writers queue on the file lock
  return o;
}

// Empties the queue tables (a JobStore has migrated them).
void empty_queue(const StoreLocation& loc) {
  const char* sql = "DELETE FROM job_latency; DELETE FROM jobs;";
  if (loc.kind == StoreKind::Postgres) {
    PgConn(loc.target).exec(sql);
  } else {
    Db db(loc.target);
    db.exec(sql);
  }
}

void fill(JobStore& store, int64_t jobs) {
  constexpr int64_t kChunk = 1000;
  for (int64_t start = 0; start < jobs; start += kChunk) {
    std::vector<JobSpec> specs;
    for (int64_t i = start; i < std::min(jobs, start + kChunk); ++i) {
      JobSpec s;
      s.batch_id = "bench";
      s.prompt = "Request " + std::to_string(i) +
                 ": summarize sparse mixture-of-experts routing in two sentences.";
      s.sampling.max_tokens = 128;
      specs.push_back(std::move(s));
    }
    store.submit_many(specs);
  }
}

}  // namespace

std::vector<WorkerRun> run_worker_bench(const std::string& location,
                                        const std::vector<int>& workers, int64_t jobs,
                                        int64_t claim_batch) {
  const StoreLocation loc = parse_store_location(location);
  std::vector<WorkerRun> out;
  JobStore filler(options(location));
  for (int w : workers) {
    MB_CHECK(w >= 1, "workers must be >= 1");
    empty_queue(loc);
    fill(filler, jobs);
    std::atomic<int64_t> done{0}, claims{0};
    std::mutex mu;
    std::multiset<int64_t> claimed;
    std::vector<std::string> errors;
    // Every worker opens its connection before the clock starts, as a running host has.
    std::vector<std::unique_ptr<JobStore>> stores;
    for (int i = 0; i < w; ++i) stores.push_back(std::make_unique<JobStore>(options(location)));
    const auto t0 = SteadyClock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < w; ++i) {
      threads.emplace_back([&, i] {
        const std::string worker = "bench-" + std::to_string(i);
        JobStore& store = *stores[static_cast<size_t>(i)];
        std::vector<int64_t> mine;
        try {
          for (;;) {
            std::vector<Job> got = store.claim(worker, claim_batch, std::chrono::minutes(5));
            if (got.empty()) break;
            ++claims;
            std::vector<Completion> cs;
            for (const Job& j : got) {
              mine.push_back(j.id);
              cs.push_back({j.id, JobResult{"ok", 40, 1, "stop", {}}, {1, 1, 1, 2, 1.0}});
            }
            for (bool ok : store.complete_many(worker, cs)) done += ok ? 1 : 0;
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back(e.what());
        }
        std::lock_guard<std::mutex> lock(mu);
        claimed.insert(mine.begin(), mine.end());
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    if (!errors.empty()) throw Error("worker failed: " + errors.front());
    int64_t twice = 0;
    for (auto it = claimed.begin(); it != claimed.end(); it = claimed.upper_bound(*it))
      twice += static_cast<int64_t>(claimed.count(*it)) - 1;
    out.push_back({loc.kind == StoreKind::Postgres ? "postgres" : "sqlite", w, claim_batch,
                   done.load(), claims.load(), seconds, twice});
  }
  return out;
}

}  // namespace moebatch::bench
