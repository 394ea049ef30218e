// The seam between JobStore and the database under it (internal to the queue module). JobStore
// checks arguments, validates specs, tracks lease tokens and computes percentiles; a backend
// runs the SQL of one database with the same contract:
//   - SqliteJobStore (sqlite_job_store.cpp): one file, writers serialized by BEGIN IMMEDIATE.
//   - PgJobStore (pg_job_store.cpp): one PostgreSQL database shared by many hosts; claims with
//     SELECT ... FOR UPDATE SKIP LOCKED, change notices with LISTEN/NOTIFY.
// Every write of a running job is conditioned on state = 'running', the lease owner and, when
// the caller knows it, the lease token (LeaseRef::token): that is what makes a job's final state
// unique whatever the number of workers.
//
// Thread-safety: one backend = one connection = one thread, like JobStore.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "queue/job_store.h"

namespace moebatch {

/// A lease as a worker names it: the job and the fencing token it was claimed with.
struct LeaseRef {
  int64_t id = 0;      ///< job id
  int64_t token = -1;  ///< lease_token from the claim; -1 = unknown, the owner check alone
};

/// The statements of JobStoreBackend::stats, the same text on both databases. Each count reads
/// an index and never the rows: count(*) the smallest one, queued and running the partial
/// indexes jobs_claim and jobs_running_lease, failed and cancelled jobs_failed_or_cancelled
/// (its WHERE repeated word for word, so SQLite sees that it applies). kStatsLatencyNewest
/// takes the window as its LIMIT (the backend appends its placeholder) and reads job_latency
/// backwards along its primary key. tests/queue/test_job_store.cpp checks the plans.
namespace stats_sql {
inline constexpr const char* kAll = "SELECT count(*) FROM jobs";
inline constexpr const char* kQueued = "SELECT count(*) FROM jobs WHERE state = 'queued'";
inline constexpr const char* kRunning = "SELECT count(*) FROM jobs WHERE state = 'running'";
inline constexpr const char* kFailedOrCancelled =
    "SELECT state, count(*) FROM jobs WHERE state IN ('failed', 'cancelled') GROUP BY state";
inline constexpr const char* kLatencyNewest =
    "SELECT queue_wait_ms, ttft_ms, total_ms, tokens_per_s FROM job_latency "
    "ORDER BY job_id DESC LIMIT ";
}  // namespace stats_sql

/// Raw material of QueueStats, read in one snapshot.
struct StatsSamples {
  int64_t jobs = 0;                                 ///< every job, whatever its state
  std::map<JobState, int64_t> counts;               ///< every state but done
  std::vector<double> wait, ttft, total, tokens_s;  ///< latency samples
};

/// One database's implementation of the JobStore contract; see the file comment.
class JobStoreBackend {
 public:
  virtual ~JobStoreBackend() = default;

  /// The schema version of the open database.
  virtual int64_t schema_version() = 0;
  /// A value that changes whenever ANOTHER connection committed a change (see JobStore).
  virtual int64_t data_version() = 0;

  /// Inserts validated specs in ONE transaction. A key naming a job with the same payload
  /// returns it (created = false); another payload throws KeyConflictError with the index.
  virtual std::vector<SubmitResult> insert(const std::vector<JobSpec>& specs, int64_t now,
                                           const std::function<void(size_t)>& progress) = 0;
  virtual std::optional<Job> get(int64_t id) = 0;
  virtual std::optional<Job> get_by_key(const std::string& client_key) = 0;
  /// filter.limit already checked.
  virtual std::vector<Job> list(const ListFilter& filter) = 0;

  /// Requeues expired leases, then leases up to n claimable rows (priority desc, age) to worker
  /// until now + lease_ms; rows with a claim_problem become failed "invalid job row: ...".
  virtual std::vector<Job> claim(const std::string& worker, int64_t n, int64_t now,
                                 int64_t lease_ms, const JobLimits& limits) = 0;
  virtual int64_t renew(const std::string& worker, const std::vector<LeaseRef>& leases,
                        int64_t until) = 0;
  virtual std::vector<int64_t> not_held(const std::string& worker,
                                        const std::vector<LeaseRef>& leases) = 0;
  /// tokens[i] belongs to completions[i] (-1 = unknown).
  virtual std::vector<bool> complete(const std::string& worker,
                                     const std::vector<Completion>& completions,
                                     const std::vector<int64_t>& tokens, int64_t now) = 0;
  virtual FailOutcome fail(const std::string& worker, LeaseRef lease, const std::string& reason,
                           bool retryable, int64_t now, const RetryPolicy& retry) = 0;
  /// The ids given back.
  virtual std::vector<int64_t> release(const std::string& worker,
                                       const std::vector<LeaseRef>& leases) = 0;
  virtual bool cancel(int64_t id, int64_t now) = 0;
  virtual int64_t requeue_expired(int64_t now) = 0;
  /// Every job and the counts of the states but done, from indexes only (JobStore derives
  /// done), and the latency rows of the latency_window highest job ids.
  virtual StatsSamples stats(int64_t latency_window) = 0;

  virtual std::optional<LatencyRecord> latency(int64_t id) = 0;
  /// counts holds only the states present; total and the rest are filled.
  virtual BatchCounts batch_counts(const std::string& batch_id) = 0;
  virtual int64_t cancel_batch(const std::string& batch_id, int64_t now) = 0;
  virtual int64_t retry_batch(const std::string& batch_id, int64_t now) = 0;
  virtual PurgeOutcome purge_batch(const std::string& batch_id) = 0;
};

/// Delay before attempt `attempts` + 1 after a retryable failure: base * 2^(attempts-1), capped.
int64_t retry_backoff_ms(const RetryPolicy& policy, int64_t attempts);

/// The message a failed job gets when a retryable failure used its last attempt.
std::string gave_up_message(const std::string& reason, int64_t attempts);

/// The SQLite implementation over the file at options.path.
std::unique_ptr<JobStoreBackend> make_sqlite_job_store(const StoreOptions& options);
/// The PostgreSQL implementation over the database at `url`.
std::unique_ptr<JobStoreBackend> make_pg_job_store(const std::string& url,
                                                   const StoreOptions& options);

}  // namespace moebatch
