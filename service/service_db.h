// The service's own tables, kept in the job database file but outside the queue's migration
// list (schemas/jobs.sql): created with CREATE TABLE IF NOT EXISTS, so the queue's
// PRAGMA user_version is untouched and either side can evolve alone.
//
//   service_cycles    one row per maintenance cycle (start, end, downtime, memory, result)
//   service_requests  operator requests the daemon polls for ("maintenance", from
//                     `moebatch maintenance --now`); one daemon takes each request
//
// Thread-safety: one ServiceDb = one SQLite connection = one thread, like JobStore.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moebatch {

class Db;

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

/// The service tables over one connection.
class ServiceDb {
 public:
  /// Opens `path` (WAL, busy timeout 5 s) and creates the service tables if missing.
  explicit ServiceDb(const std::filesystem::path& path);
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

 private:
  std::unique_ptr<Db> db_;
};

}  // namespace moebatch
