// The service's own tables, kept in the job database beside the queue. On SQLite they stay
// outside the queue's migration list (schemas/jobs.sql): created with CREATE TABLE IF NOT
// EXISTS, so the queue's PRAGMA user_version is untouched and either side can evolve alone. On
// PostgreSQL they are migration 2 of schemas/jobs_pg.sql. The SQL of each database lives
// behind ServiceDbBackend (service/service_db_backend.h).
//
//   service_cycles    one row per maintenance cycle (start, end, downtime, memory, result)
//   service_requests  operator requests the daemon polls for ("maintenance", from
//                     `moebatch maintenance --now`); one daemon takes each request
//   service_final_events  one row per job that reached done, failed or cancelled, written by
//                     a trigger on jobs (created by the daemon), so the daemon sees every final
//                     transition whoever made it: its own results, a cancel from the CLI or the
//                     ingress, a row the store failed inside claim (invalid, or lease attempts
//                     exhausted). A running daemon prunes rows older than an hour. Ids
//                     become visible in increasing order on both databases, so a reader's
//                     "after id" cursor never skips a row.
//
// Also here: StoreHealth, the io thread's record of whether the store takes writes, which
// /health and /metrics read instead of touching the store.
//
// Thread-safety: one ServiceDb = one database connection = one thread, like JobStore.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moebatch {

class ServiceDbBackend;

/// One maintenance cycle as recorded.
struct CycleRecord {
  int64_t id = 0;           ///< row id
  std::string worker;       ///< daemon that ran it
  std::string trigger;      ///< "schedule" | "request"
  int64_t started_at = 0;   ///< ms since the epoch (service clock)
  int64_t ended_at = 0;     ///< ms since the epoch
  int64_t downtime_ms = 0;  ///< admission paused: started_at .. resumed
  int64_t drained = 0;      ///< sequences finished during the drain
  int64_t requeued = 0;     ///< sequences given back at the drain deadline
  int64_t mem_before = 0;   ///< process RSS before the teardown, bytes
  int64_t mem_after = 0;    ///< process RSS after rebuild + warmup, bytes
  int64_t warmup_ms = 0;    ///< warmup batch duration
  std::string result;       ///< "ok" | "failed"
  std::string error;        ///< failure reason, empty when ok
};

/// One final transition from service_final_events, with the job's notice fields.
struct FinalEvent {
  int64_t seq = 0;                        ///< service_final_events.id (increasing)
  int64_t job_id = 0;                     ///< jobs.id
  std::string state;                      ///< "done" | "failed" | "cancelled"
  std::optional<std::string> client_key;  ///< the job's client key
  std::optional<std::string> batch_id;    ///< the job's batch
  std::optional<std::string> error;       ///< the job's error
};

/// Latency rows of every completed job, with its completion tokens (the demo's report).
struct LatencySamples {
  std::vector<double> wait, ttft, total;  ///< job_latency ms: queue wait, TTFT, total
  int64_t completion_tokens = 0;          ///< summed over those jobs
};

/// The service tables over one connection.
class ServiceDb {
 public:
  /// Opens the database at `location` (a SQLite file, WAL; or a postgresql:// URL) and creates
  /// the service tables if missing (SQLite) or migrates the schema (PostgreSQL), waiting up to
  /// 5 s for another writer; afterwards writes wait `busy_timeout` for another writer's lock.
  /// With `final_log` (the daemon; the jobs table must exist) also the final-transition log's
  /// trigger; others leave it alone, so no rows pile up where no daemon reads and prunes them.
  explicit ServiceDb(const std::string& location,
                     std::chrono::milliseconds busy_timeout = std::chrono::seconds(5),
                     bool final_log = false);
  ~ServiceDb();
  ServiceDb(const ServiceDb&) = delete;
  ServiceDb& operator=(const ServiceDb&) = delete;

  /// Appends a cycle record; returns its id.
  int64_t record_cycle(const CycleRecord& c);
  /// Every cycle, oldest first.
  std::vector<CycleRecord> cycles();
  /// Queues an operator request of `kind` ("maintenance"); returns its id.
  int64_t add_request(const std::string& kind, int64_t now_ms);
  /// Takes the oldest untaken request of `kind` for `worker`; its id, or nullopt.
  std::optional<int64_t> take_request(const std::string& kind, const std::string& worker,
                                      int64_t now_ms);
  /// Jobs per state ("queued" → n, ...), every state present.
  std::map<std::string, int64_t> job_counts();
  /// Every job_latency row with its job's completion tokens.
  LatencySamples latency_samples();
  /// Runs plain SQL as an external producer writes it (schemas/README.md: statements that
  /// both databases accept) in one transaction; Error with the database's message.
  void exec_producer_sql(const std::string& sql);

  /// The newest final event's seq (0 when none): where a new reader starts.
  int64_t last_final_event();
  /// Final events after `seq`, oldest first, at most `limit`.
  std::vector<FinalEvent> final_events_after(int64_t seq, int64_t limit);
  /// Deletes final events older than `max_age_s`; returns how many.
  int64_t prune_final_events(int64_t max_age_s);

 private:
  std::unique_ptr<ServiceDbBackend> impl_;
};

/// Whether the job store takes writes, as the io thread's own writes found it. Every store
/// write of the io thread reports here; /health and /metrics read it and never wait on the
/// store. A write refused because another connection holds the lock is normal for a moment
/// (the ingress commits, a bulk import): the store counts as unwritable only once writes have
/// failed for `lock_grace_ms`. Any other failure (a full disk, an I/O error) counts at once.
/// While writes fail, the next one waits for a backoff (50 ms doubling to 1 s). io thread only.
class StoreHealth {
 public:
  /// `lock_grace_ms`: how long lock failures may last before the store is unwritable.
  explicit StoreHealth(int64_t lock_grace_ms) : lock_grace_ms_(lock_grace_ms) {}
  /// A write committed.
  void write_ok();
  /// A write failed at `now_ms` with `error` (the exception's text).
  void write_failed(const std::string& error, int64_t now_ms);
  /// Whether a store error's text says another connection holds a lock: SQLite's "is locked"
  /// (SQLITE_BUSY / SQLITE_LOCKED), or a PostgreSQL SQLSTATE 55P03 (lock_timeout), 40P01
  /// (deadlock) or 40001 (serialization). Anything else (53100 disk full, a lost connection,
  /// SQLite's "full") is not.
  static bool is_lock_failure(const std::string& error);
  /// True since a write failed and until one commits.
  bool failing() const { return failing_since_ms_ >= 0; }
  /// Failing for longer than the grace, or with something other than a held lock.
  bool unwritable(int64_t now_ms) const;
  /// Whether a write may be tried now (always, unless failing and within the backoff).
  bool may_try(int64_t now_ms) const { return !failing() || now_ms >= next_try_ms_; }
  /// Whether a failure at `now_ms` should be logged: at most one line every 10 s.
  bool log_due(int64_t now_ms);
  /// The last failure's text.
  const std::string& last_error() const { return last_error_; }
  /// Writes failed since start.
  int64_t failures() const { return failures_; }
  /// Failed writes in the current run, none once one committed.
  int64_t failures_in_a_row() const { return in_a_row_; }

 private:
  int64_t lock_grace_ms_;
  int64_t failing_since_ms_ = -1;
  int64_t next_try_ms_ = 0;
  int64_t last_log_ms_ = -1;
  int64_t failures_ = 0, in_a_row_ = 0;
  bool lock_only_ = true;  // every failure of this run was a held lock
  std::string last_error_;
};

}  // namespace moebatch
