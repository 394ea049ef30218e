#include "service/service_db.h"

#include "common/error.h"
#include "queue/sqlite_db.h"

namespace moebatch {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS service_cycles (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  worker       TEXT NOT NULL,
  trigger      TEXT NOT NULL CHECK (trigger IN ('schedule', 'request')),
  started_at   INTEGER NOT NULL,
  ended_at     INTEGER NOT NULL,
  downtime_ms  INTEGER NOT NULL,
  drained      INTEGER NOT NULL,
  requeued     INTEGER NOT NULL,
  mem_before   INTEGER NOT NULL,
  mem_after    INTEGER NOT NULL,
  warmup_ms    INTEGER NOT NULL,
  result       TEXT NOT NULL CHECK (result IN ('ok', 'failed')),
  error        TEXT
);
CREATE TABLE IF NOT EXISTS service_requests (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  kind          TEXT NOT NULL CHECK (kind IN ('maintenance')),
  requested_at  INTEGER NOT NULL,
  taken_by      TEXT,
  taken_at      INTEGER
);
)sql";

}  // namespace

ServiceDb::ServiceDb(const std::filesystem::path& path) : db_(std::make_unique<Db>(path)) {
  SQLITE_CHECK(db_->get(), sqlite3_busy_timeout(db_->get(), 5000));
  db_->exec("PRAGMA journal_mode=WAL");
  Transaction tx(*db_, true);
  db_->exec(kSchema);
  tx.commit();
}

ServiceDb::~ServiceDb() = default;

int64_t ServiceDb::record_cycle(const CycleRecord& c) {
  Transaction tx(*db_, true);
  Stmt& s = db_->prepare(
      "INSERT INTO service_cycles (worker, trigger, started_at, ended_at, downtime_ms, drained, "
      "requeued, mem_before, mem_after, warmup_ms, result, error) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)");
  s.bind(1, std::string_view(c.worker))
      .bind(2, std::string_view(c.trigger))
      .bind(3, c.started_at)
      .bind(4, c.ended_at);
  s.bind(5, c.downtime_ms).bind(6, c.drained).bind(7, c.requeued).bind(8, c.mem_before);
  s.bind(9, c.mem_after).bind(10, c.warmup_ms).bind(11, std::string_view(c.result));
  s.bind(12, c.error.empty() ? std::optional<std::string>() : std::optional(c.error));
  s.step();
  const int64_t id = db_->last_insert_rowid();
  tx.commit();
  return id;
}

std::vector<CycleRecord> ServiceDb::cycles() {
  Stmt& s = db_->prepare(
      "SELECT id, worker, trigger, started_at, ended_at, downtime_ms, drained, requeued, "
      "mem_before, mem_after, warmup_ms, result, error FROM service_cycles ORDER BY id");
  std::vector<CycleRecord> out;
  while (s.step()) {
    CycleRecord c;
    c.id = s.i64(0);
    c.worker = s.text(1);
    c.trigger = s.text(2);
    c.started_at = s.i64(3);
    c.ended_at = s.i64(4);
    c.downtime_ms = s.i64(5);
    c.drained = s.i64(6);
    c.requeued = s.i64(7);
    c.mem_before = s.i64(8);
    c.mem_after = s.i64(9);
    c.warmup_ms = s.i64(10);
    c.result = s.text(11);
    c.error = s.opt_text(12).value_or("");
    out.push_back(std::move(c));
  }
  s.reset();
  return out;
}

int64_t ServiceDb::add_request(const std::string& kind, int64_t now_ms) {
  Transaction tx(*db_, true);
  Stmt& s = db_->prepare("INSERT INTO service_requests (kind, requested_at) VALUES (?1, ?2)");
  s.bind(1, std::string_view(kind)).bind(2, now_ms);
  s.step();
  const int64_t id = db_->last_insert_rowid();
  tx.commit();
  return id;
}

std::optional<int64_t> ServiceDb::take_request(const std::string& kind, const std::string& worker,
                                               int64_t now_ms) {
  // Polled often: a plain read first, and a write only when there is something to take. The
  // conditional UPDATE is atomic on its own, so two daemons never both take one request.
  Stmt& q = db_->prepare(
      "SELECT id FROM service_requests WHERE kind = ?1 AND taken_at IS NULL ORDER BY id LIMIT 1");
  q.bind(1, std::string_view(kind));
  const bool found = q.step();
  const int64_t id = found ? q.i64(0) : 0;
  q.reset();
  if (!found) return std::nullopt;
  Stmt& u = db_->prepare(
      "UPDATE service_requests SET taken_by = ?2, taken_at = ?3 WHERE id = ?1 AND taken_at IS "
      "NULL");
  u.bind(1, id).bind(2, std::string_view(worker)).bind(3, now_ms);
  u.step();
  if (db_->changes() != 1) return std::nullopt;
  return id;
}

std::map<std::string, int64_t> ServiceDb::job_counts() {
  std::map<std::string, int64_t> out{
      {"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}, {"cancelled", 0}};
  Stmt& s = db_->prepare("SELECT state, count(*) FROM jobs GROUP BY state");
  while (s.step()) out[s.text(0)] = s.i64(1);
  s.reset();
  return out;
}

}  // namespace moebatch
