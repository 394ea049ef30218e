// The seam between ServiceDb and the database under it (internal to the service module), as
// JobStoreBackend is for JobStore: ServiceDb keeps its public API and each database runs its
// own SQL with the same contract:
//   - SQLite (service_db_sqlite.cpp): the tables are created IF NOT EXISTS next to the queue's,
//     outside its migration list; final-event ids come from AUTOINCREMENT under the file's
//     single writer, so they commit in order.
//   - PostgreSQL (service_db_pg.cpp): the tables are migration 2 of schemas/jobs_pg.sql; a
//     request insert sends NOTIFY; final-event ids are taken under an advisory lock so they
//     commit in order too (see the migration's comment).
//
// Thread-safety: one backend = one connection = one thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "service/service_db.h"

namespace moebatch {

/// One database's implementation of ServiceDb; see ServiceDb for each method's contract.
class ServiceDbBackend {
 public:
  virtual ~ServiceDbBackend() = default;
  virtual int64_t record_cycle(const CycleRecord& c) = 0;
  virtual std::vector<CycleRecord> cycles() = 0;
  virtual int64_t add_request(const std::string& kind, int64_t now_ms) = 0;
  virtual std::optional<int64_t> take_request(const std::string& kind, const std::string& worker,
                                              int64_t now_ms) = 0;
  virtual std::map<std::string, int64_t> job_counts() = 0;
  virtual LatencySamples latency_samples() = 0;
  virtual void exec_producer_sql(const std::string& sql) = 0;
  virtual int64_t last_final_event() = 0;
  virtual std::vector<FinalEvent> final_events_after(int64_t seq, int64_t limit) = 0;
  virtual int64_t prune_final_events(int64_t max_age_s) = 0;
};

/// The SQLite implementation over the file at `path`.
std::unique_ptr<ServiceDbBackend> make_sqlite_service_db(const std::string& path,
                                                         std::chrono::milliseconds busy_timeout,
                                                         bool final_log);
/// The PostgreSQL implementation over the database at `url`.
std::unique_ptr<ServiceDbBackend> make_pg_service_db(const std::string& url,
                                                     std::chrono::milliseconds busy_timeout,
                                                     bool final_log);

}  // namespace moebatch
