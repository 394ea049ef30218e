// The PostgreSQL implementation of JobStoreBackend (internal to the queue module): one database
// shared by any number of moebatch hosts. Claims lock their rows with SELECT ... FOR UPDATE SKIP
// LOCKED, so claimers never wait on each other or take one row twice; every write under a lease
// is a conditional UPDATE on state, owner and fencing token, so a job's final state is written
// once. Change notices come by LISTEN/NOTIFY (channel moebatch_jobs, sent by triggers of
// schemas/jobs_pg.sql). Opening, migrations, submission and reads are in pg_job_store.cpp; the
// lease protocol in pg_job_store_lease.cpp.
//
// Times come from StoreOptions::clock like SQLite's, so the hosts' clocks must agree to well
// within a lease (NTP); docs/postgres.md.
#pragma once

#include <memory>

#include "queue/job_row.h"
#include "queue/job_store_backend.h"
#include "queue/pg_conn.h"

namespace moebatch {

/// JobStoreBackend over one libpq connection.
class PgJobStore : public JobStoreBackend {
 public:
  /// Connects to url, sets lock_timeout = options.busy_timeout, applies pending migrations
  /// and LISTENs for change notices.
  PgJobStore(const std::string& url, const StoreOptions& options);

  int64_t schema_version() override;
  int64_t data_version() override;
  std::vector<SubmitResult> insert(const std::vector<JobSpec>& specs, int64_t now,
                                   const std::function<void(size_t)>& progress) override;
  std::optional<Job> get(int64_t id) override;
  std::optional<Job> get_by_key(const std::string& client_key) override;
  std::vector<Job> list(const ListFilter& filter) override;
  std::vector<Job> claim(const std::string& worker, int64_t n, int64_t now, int64_t lease_ms,
                         const JobLimits& limits) override;
  int64_t renew(const std::string& worker, const std::vector<LeaseRef>& leases,
                int64_t until) override;
  std::vector<int64_t> not_held(const std::string& worker,
                                const std::vector<LeaseRef>& leases) override;
  std::vector<bool> complete(const std::string& worker, const std::vector<Completion>& completions,
                             const std::vector<int64_t>& tokens, int64_t now) override;
  FailOutcome fail(const std::string& worker, LeaseRef lease, const std::string& reason,
                   bool retryable, int64_t now, const RetryPolicy& retry) override;
  std::vector<int64_t> release(const std::string& worker,
                               const std::vector<LeaseRef>& leases) override;
  bool cancel(int64_t id, int64_t now) override;
  int64_t requeue_expired(int64_t now) override;
  StatsSamples stats(int64_t latency_window) override;
  std::optional<LatencyRecord> latency(int64_t id) override;
  BatchCounts batch_counts(const std::string& batch_id) override;
  int64_t cancel_batch(const std::string& batch_id, int64_t now) override;
  int64_t retry_batch(const std::string& batch_id, int64_t now) override;
  PurgeOutcome purge_batch(const std::string& batch_id) override;

 private:
  void migrate();
  SubmitResult insert_one(const JobSpec& spec, size_t index, int64_t now);
  int64_t requeue_expired_locked(int64_t now);
  std::vector<Job> read_jobs(const std::string& sql_suffix, const PgParams& params);

  std::unique_ptr<PgConn> conn_;
  JobLimits limits_;     // the sizes a row read by get and list may have (claims get theirs)
  int64_t notices_ = 0;  // NOTIFYs from other sessions seen so far: the data_version
};

/// Decodes row `row` of a result that selected kJobColumns (see decode_job_row).
JobRow read_pg_job_row(const PgResult& r, int row, const JobLimits& limits);

/// Runs the migrations of schemas/jobs_pg.sql above the database's version, each in its own
/// transaction under the queue's advisory lock (so concurrent openers migrate once), and
/// returns the version reached. Error when the database is newer than this build.
int64_t migrate_pg_schema(PgConn& conn, const std::string& where);

/// The schema version recorded in moebatch_schema (0 when the table is missing).
int64_t pg_schema_version(PgConn& conn);

}  // namespace moebatch
