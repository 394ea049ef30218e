// ServiceDb: opens the backend of the database a location names and forwards to it. StoreHealth:
// the io thread's record of store writes, and which failures count as a held lock.
#include "service/service_db.h"

#include <algorithm>

#include "common/error.h"
#include "queue/store_url.h"
#include "service/service_db_backend.h"

namespace moebatch {
namespace {

// Backoff between writes while the store refuses them.
constexpr int64_t kRetryFirstMs = 50;
constexpr int64_t kRetryMaxMs = 1000;
constexpr int64_t kLogEveryMs = 10000;

}  // namespace

ServiceDb::ServiceDb(const std::string& location, std::chrono::milliseconds busy_timeout,
                     bool final_log) {
  const StoreLocation loc = parse_store_location(location);
  impl_ = loc.kind == StoreKind::Postgres
              ? make_pg_service_db(loc.target, busy_timeout, final_log)
              : make_sqlite_service_db(loc.target, busy_timeout, final_log);
}

ServiceDb::~ServiceDb() = default;

int64_t ServiceDb::record_cycle(const CycleRecord& c) { return impl_->record_cycle(c); }
std::vector<CycleRecord> ServiceDb::cycles() { return impl_->cycles(); }
int64_t ServiceDb::add_request(const std::string& kind, int64_t now_ms) {
  return impl_->add_request(kind, now_ms);
}
std::optional<int64_t> ServiceDb::take_request(const std::string& kind, const std::string& worker,
                                               int64_t now_ms) {
  return impl_->take_request(kind, worker, now_ms);
}

std::map<std::string, int64_t> ServiceDb::job_counts() {
  std::map<std::string, int64_t> out{
      {"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}, {"cancelled", 0}};
  for (const auto& [state, n] : impl_->job_counts()) out[state] = n;
  return out;
}

LatencySamples ServiceDb::latency_samples() { return impl_->latency_samples(); }
void ServiceDb::exec_producer_sql(const std::string& sql) { impl_->exec_producer_sql(sql); }
int64_t ServiceDb::last_final_event() { return impl_->last_final_event(); }
std::vector<FinalEvent> ServiceDb::final_events_after(int64_t seq, int64_t limit) {
  MB_CHECK(limit >= 1, "final_events_after: limit must be >= 1");
  return impl_->final_events_after(seq, limit);
}
int64_t ServiceDb::prune_final_events(int64_t max_age_s) {
  return impl_->prune_final_events(max_age_s);
}

bool StoreHealth::is_lock_failure(const std::string& error) {
  // SQLite's text for SQLITE_BUSY / SQLITE_LOCKED.
  if (error.find("is locked") != std::string::npos) return true;
  // PgError's text ends in "[SQLSTATE xxxxx]": lock_not_available (lock_timeout ran out),
  // deadlock_detected, serialization_failure. Each is another session's lock, gone once it
  // commits; disk_full (53100) and a lost connection (08xxx) are not.
  for (const char* state : {"55P03", "40P01", "40001"}) {
    if (error.find(std::string("[SQLSTATE ") + state + "]") != std::string::npos) return true;
  }
  return false;
}

void StoreHealth::write_ok() {
  failing_since_ms_ = -1;
  in_a_row_ = 0;
  lock_only_ = true;
}

void StoreHealth::write_failed(const std::string& error, int64_t now_ms) {
  ++failures_;
  ++in_a_row_;
  if (failing_since_ms_ < 0) failing_since_ms_ = now_ms;
  lock_only_ = lock_only_ && is_lock_failure(error);
  last_error_ = error;
  int64_t delay = kRetryFirstMs;
  for (int64_t i = 1; i < in_a_row_ && delay < kRetryMaxMs; ++i) delay *= 2;
  next_try_ms_ = now_ms + std::min(delay, kRetryMaxMs);
}

bool StoreHealth::unwritable(int64_t now_ms) const {
  if (!failing()) return false;
  return !lock_only_ || now_ms - failing_since_ms_ >= lock_grace_ms_;
}

bool StoreHealth::log_due(int64_t now_ms) {
  if (last_log_ms_ >= 0 && now_ms - last_log_ms_ < kLogEveryMs) return false;
  last_log_ms_ = now_ms;
  return true;
}

}  // namespace moebatch
