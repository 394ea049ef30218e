// The SQLite implementation of JobStoreBackend (internal to the queue module): one file in WAL
// mode; every writer takes the file's write lock up front (BEGIN IMMEDIATE), so the lease
// protocol's read-then-write steps run alone. Opening, migrations, submission and reads are in
// sqlite_job_store.cpp; the lease protocol in sqlite_job_store_lease.cpp.
#pragma once

#include <memory>

#include "queue/job_store_backend.h"
#include "queue/sqlite_db.h"

namespace moebatch {

/// JobStoreBackend over one SQLite connection.
class SqliteJobStore : public JobStoreBackend {
 public:
  /// Opens or creates options.path, applies pragmas and pending migrations.
  explicit SqliteJobStore(const StoreOptions& options);

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
  bool complete_locked(const std::string& worker, const Completion& c, int64_t token, int64_t now);
  int64_t requeue_expired_locked(int64_t now);
  std::vector<Job> read_jobs(const std::string& sql_suffix, const std::function<void(Stmt&)>& bind);

  std::string path_;  // for messages
  std::unique_ptr<Db> db_;
  JobLimits limits_;  // the sizes a row read by get and list may have (claims get theirs)
};

}  // namespace moebatch
