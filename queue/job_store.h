// Durable job queue on one SQLite file (WAL), or on one PostgreSQL database shared by several
// hosts (StoreOptions::path = postgresql://...; queue/store_url.h). Producers submit (CLI,
// ZeroMQ ingress, or plain-SQL INSERTs per schemas/README.md); the dispatcher claims jobs under a
// time-limited lease, renews it, and reports complete or fail. Execution is at-least-once (an
// expired lease is handed to another worker) with exactly one final result per job:
// complete/fail/release only succeed for the current lease owner of a running job holding the
// lease's fencing token, so a stale worker cannot overwrite a result.
//
// Thread-safety: a JobStore owns one database connection and is NOT thread-safe; use one
// JobStore per thread. Any number of JobStores, in any number of threads, processes or hosts
// (PostgreSQL), may open the same database: SQLite writers serialize on the file's lock (BEGIN
// IMMEDIATE + busy_timeout); PostgreSQL claimers skip each other's locked rows.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "queue/clock.h"
#include "queue/job.h"
#include "queue/job_validate.h"
#include "queue/store_url.h"

namespace moebatch {

class JobStoreBackend;
struct LeaseRef;

/// SQLite durability level. FULL fsyncs the WAL at every commit and is the power-loss-safe
/// choice; NORMAL is safe against process crashes but may lose the last commits on power loss.
enum class Synchronous { Normal, Full };

/// Exponential retry backoff: base * 2^(attempts-1), capped.
struct RetryPolicy {
  int64_t base_backoff_ms = 1000;  ///< delay after the first failed attempt
  int64_t max_backoff_ms = 60000;  ///< cap
};

/// How to open a store.
struct StoreOptions {
  /// SQLite database file (created if missing), or a postgresql:// / postgres:// URL.
  std::filesystem::path path;
  Synchronous synchronous = Synchronous::Normal;  ///< see Synchronous
  /// Wait for other writers' locks this long (SQLite busy_timeout, PostgreSQL lock_timeout).
  std::chrono::milliseconds busy_timeout{5000};
  std::shared_ptr<const Clock> clock = std::make_shared<SystemClock>();  ///< time source
  JobLimits limits;                                                      ///< validation limits
  RetryPolicy retry;  ///< backoff between attempts
  /// stats() reads the latency rows of this many done jobs at most, those with the highest ids
  /// (1..1,000,000): the percentiles describe recent work, and the read stays bounded however
  /// many jobs the table holds.
  int64_t stats_latency_window = 10000;
};

/// A client_key that already names a job with a different payload (409 Conflict in HTTP terms).
/// An InputError: the producer reused a key for another request, retrying cannot help.
class KeyConflictError : public InputError {
 public:
  /// index: position of the offending spec in the submitted list; existing_id: the key's job.
  KeyConflictError(const std::string& key, int64_t existing_id, size_t index)
      : InputError("client_key: '" + key + "' already names job " + std::to_string(existing_id) +
                   " with a different payload"),
        key_(key),
        existing_id_(existing_id),
        index_(index) {}
  /// The reused key.
  const std::string& key() const { return key_; }
  /// The job the key already names.
  int64_t existing_id() const { return existing_id_; }
  /// Index of the offending spec in submit_many's list (0 for submit).
  size_t index() const { return index_; }

 private:
  std::string key_;
  int64_t existing_id_;
  size_t index_;
};

/// Outcome of one submission.
struct SubmitResult {
  int64_t id = 0;        ///< the job's id
  bool created = false;  ///< false when client_key matched an existing job
};

/// Filter for list(); unset fields match everything.
struct ListFilter {
  std::optional<JobState> state;        ///< only this state
  std::optional<std::string> batch_id;  ///< only this batch
  int64_t after_id = 0;                 ///< ids greater than this (paging)
  int64_t limit = 100;                  ///< at most this many rows, 1..100000
};

/// One completion for complete_many.
struct Completion {
  int64_t id = 0;         ///< job id
  JobResult result;       ///< generated output
  LatencyRecord latency;  ///< timings
};

/// What fail() did.
enum class FailOutcome {
  Retrying,  ///< back to queued, claimable after the backoff
  Failed,    ///< failed for good (not retryable, or attempts exhausted)
  NotOwner,  ///< ignored: the caller does not hold the lease of a running job
};

/// Nearest-rank percentiles of one latency metric over recorded jobs.
struct Percentiles {
  int64_t count = 0;  ///< samples
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};

/// Queue counts and latency summary. The counts cover every job; the percentiles only the
/// latency rows of the newest `latency_window` done jobs (highest ids).
struct QueueStats {
  std::map<JobState, int64_t> counts;  ///< every state present, zero when empty
  int64_t latency_window = 0;          ///< StoreOptions::stats_latency_window
  Percentiles queue_wait_ms;           ///< enqueued -> started
  Percentiles ttft_ms;                 ///< started -> first token
  Percentiles total_ms;                ///< enqueued -> finished
  Percentiles tokens_per_s;            ///< decode throughput per job
};

/// One batch's jobs at one moment (JobStore::batch_counts).
struct BatchCounts {
  std::map<JobState, int64_t> counts;        ///< every state, zero when empty
  int64_t total = 0;                         ///< jobs of the batch
  int64_t prompt_tokens = 0;                 ///< summed over done jobs
  int64_t completion_tokens = 0;             ///< summed over done jobs
  std::optional<int64_t> first_enqueued_at;  ///< oldest job's enqueue time
  std::optional<int64_t> last_finished_at;   ///< newest final transition
  /// Jobs not final yet (queued + running).
  int64_t unfinished() const { return counts.at(JobState::Queued) + counts.at(JobState::Running); }
};

/// What purge_batch did.
struct PurgeOutcome {
  int64_t deleted = 0;     ///< jobs removed (with their latency rows)
  int64_t unfinished = 0;  ///< queued or running jobs that made the purge refuse; 0 on success
};

/// The job queue over one database connection. See the file comment for thread-safety.
class JobStore {
 public:
  /// Current SQLite schema version (highest migration in schemas/jobs.sql).
  static int schema_version_latest();
  /// Current schema version of a database kind (schemas/jobs.sql or schemas/jobs_pg.sql).
  static int schema_version_latest(StoreKind kind);

  /// Opens or creates the database, applies settings and pending migrations. Throws InputError
  /// for a location of an unsupported kind, Error when the database cannot be opened or is
  /// newer than this build understands.
  explicit JobStore(StoreOptions options);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  /// Validates (InputError on a bad spec) and inserts. An existing client_key with the same
  /// payload returns that job (created = false); with a different payload it throws
  /// KeyConflictError and inserts nothing.
  SubmitResult submit(const JobSpec& spec);
  /// All specs in ONE transaction: all validated first (InputError naming the index), then
  /// inserted; nothing is inserted when any is invalid or any key conflicts (KeyConflictError
  /// naming the index). progress(done) is called periodically.
  std::vector<SubmitResult> submit_many(const std::vector<JobSpec>& specs,
                                        const std::function<void(size_t)>& progress = {});

  /// The job with this id, if any.
  std::optional<Job> get(int64_t id);
  /// The job with this client key, if any.
  std::optional<Job> get_by_key(const std::string& client_key);
  /// Jobs matching filter, by id ascending.
  std::vector<Job> list(const ListFilter& filter);

  /// Requeues expired leases, then leases up to n queued jobs (priority desc, then age) to
  /// worker for lease. Rows that fail validation (external producers) become failed with the
  /// reason and are skipped. Claimed jobs are running, attempts incremented.
  std::vector<Job> claim(const std::string& worker, int64_t n, std::chrono::milliseconds lease);
  /// Extends the lease of those ids that worker still holds; returns how many were renewed.
  /// Here and in not_held/complete/fail/release, a job this store claimed is also checked
  /// against the lease token the claim returned (Job::lease_token).
  int64_t renew(const std::string& worker, const std::vector<int64_t>& ids,
                std::chrono::milliseconds lease);
  /// Those of `ids` whose lease `worker` no longer holds (cancelled, finished, expired and taken
  /// over, or gone): the work on them can stop. Read-only.
  std::vector<int64_t> not_held(const std::string& worker, const std::vector<int64_t>& ids);
  /// Records the result if worker holds the lease of running job id; false (and no change)
  /// otherwise, e.g. for a stale worker whose lease expired and was taken over or cancelled.
  bool complete(const std::string& worker, int64_t id, const JobResult& result,
                const LatencyRecord& latency);
  /// complete() for many jobs in ONE transaction; element i tells whether completions[i] landed.
  std::vector<bool> complete_many(const std::string& worker,
                                  const std::vector<Completion>& completions);
  /// Reports a failed attempt. Retryable failures go back to queued with backoff until
  /// max_attempts is reached; then, or when not retryable, the job is failed for good.
  FailOutcome fail(const std::string& worker, int64_t id, const std::string& reason,
                   bool retryable);
  /// Gives leased jobs back without counting the attempt (shutdown, maintenance drain).
  int64_t release(const std::string& worker, const std::vector<int64_t>& ids);
  /// Cancels a queued or running job; false when it is already final or does not exist.
  bool cancel(int64_t id);
  /// The latency record complete() wrote for a done job; nullopt for any other job.
  std::optional<LatencyRecord> latency(int64_t id);

  /// Counts by state and token totals of the jobs whose batch_id is `batch_id` (all zero for
  /// a batch without jobs).
  BatchCounts batch_counts(const std::string& batch_id);
  /// Cancels every queued or running job of the batch in one transaction; returns how many.
  /// Final jobs keep their state. Workers holding a cancelled job lose the lease as with cancel.
  int64_t cancel_batch(const std::string& batch_id);
  /// Puts every failed job of the batch back in the queue in one transaction (attempts 0, error
  /// cleared, claimable now); returns how many. The one way out of a final state, an operator's:
  /// the lease token is kept, so each new run still ends in exactly one final result.
  int64_t retry_batch(const std::string& batch_id);
  /// Deletes every job of the batch and its latency rows in one transaction, only when none is
  /// queued or running (else deletes nothing and reports how many are unfinished).
  PurgeOutcome purge_batch(const std::string& batch_id);

  /// Running jobs whose lease ended before now go back to queued, or to failed when their
  /// attempts are exhausted. Returns how many rows changed. claim() calls this itself.
  int64_t requeue_expired();

  /// Counts by state and latency percentiles, in one snapshot. The counts read indexes only
  /// (queued and running through their partial indexes, failed and cancelled through
  /// jobs_failed_or_cancelled, done is the rest of count(*)); the percentiles read at most
  /// options().stats_latency_window latency rows, the newest by job id. Not cached: the ZeroMQ
  /// ingress caches its answer (queue/zmq/store_worker.h).
  QueueStats stats();
  /// Changes whenever ANOTHER connection commits to the queue, so a poller can skip its claim
  /// query while nothing happened; commits on this connection do not count. SQLite: PRAGMA
  /// data_version. PostgreSQL: the number of NOTIFYs on moebatch_jobs from other sessions.
  int64_t data_version();
  /// The schema version of the open database (SQLite: PRAGMA user_version).
  int64_t schema_version();
  /// Which database this store is on.
  StoreKind kind() const { return kind_; }
  /// The clock this store reads.
  const Clock& clock() const { return *options_.clock; }
  /// The options the store was opened with.
  const StoreOptions& options() const { return options_; }

 private:
  // The token a lease this store claimed was given; -1 for jobs it did not claim.
  int64_t token_of(int64_t id) const;
  std::vector<LeaseRef> leases_of(const std::vector<int64_t>& ids) const;
  void forget(int64_t id) { tokens_.erase(id); }

  StoreOptions options_;
  StoreKind kind_ = StoreKind::Sqlite;
  std::unique_ptr<JobStoreBackend> backend_;
  std::map<int64_t, int64_t> tokens_;  // job id -> lease token, for jobs claimed here and held
};

}  // namespace moebatch
