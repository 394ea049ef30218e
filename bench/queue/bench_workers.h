// Claim scaling: N workers (threads, one JobStore connection each, as N hosts would have) drain
// one queue with claim + complete_many, on a SQLite file or a PostgreSQL database.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moebatch::bench {

/// One drain of `jobs` jobs by `workers` workers.
struct WorkerRun {
  std::string store;          ///< "sqlite" | "postgres"
  int workers = 0;            ///< concurrent claimers
  int64_t claim_batch = 0;    ///< jobs per claim (and per complete_many)
  int64_t jobs = 0;           ///< jobs claimed and completed
  int64_t claims = 0;         ///< claim calls that returned at least one job
  double seconds = 0;         ///< wall time of the drain
  int64_t double_claims = 0;  ///< jobs claimed twice (must be 0)
};

/// Fills the queue at `location` (emptied first) with `jobs` jobs, then drains it with each
/// worker count in turn (refilling in between). Error when the database cannot be used.
std::vector<WorkerRun> run_worker_bench(const std::string& location,
                                        const std::vector<int>& workers, int64_t jobs,
                                        int64_t claim_batch);

}  // namespace moebatch::bench
