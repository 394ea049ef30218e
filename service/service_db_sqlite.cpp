// ServiceDb on SQLite: the service tables are created IF NOT EXISTS beside the queue's, outside
// its migration list (schemas/jobs.sql), so the queue's PRAGMA user_version is untouched.
#include "common/error.h"
#include "queue/sqlite_db.h"
#include "service/service_db_backend.h"

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

// The final-transition log. The trigger runs inside whichever transaction finishes the job
// (the store's, the ingress's, an operator's SQL), so the log has a row exactly when the job's
// final state committed. AUTOINCREMENT: ids are never reused, even after pruning empties the
// table, so a reader's "after seq" cursor cannot skip new rows; the file's single writer makes
// them commit in order.
constexpr const char* kFinalLog = R"sql(
CREATE TABLE IF NOT EXISTS service_final_events (
  id      INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id  INTEGER NOT NULL,
  state   TEXT NOT NULL,
  at      INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS service_final_event AFTER UPDATE OF state ON jobs
WHEN NEW.state IN ('done', 'failed', 'cancelled')
  AND OLD.state NOT IN ('done', 'failed', 'cancelled')
BEGIN
  INSERT INTO service_final_events (job_id, state, at)
  VALUES (NEW.id, NEW.state, CAST(strftime('%s', 'now') AS INTEGER));
END;
)sql";

class SqliteServiceDb final : public ServiceDbBackend {
 public:
  SqliteServiceDb(const std::string& path, std::chrono::milliseconds busy_timeout, bool final_log)
      : db_(std::make_unique<Db>(path)) {
    // Creating the tables may wait for another writer as long as any start-up step; only the
    // running daemon's writes get the caller's (short) wait.
    SQLITE_CHECK(db_->get(), sqlite3_busy_timeout(db_->get(), 5000));
    db_->exec("PRAGMA journal_mode=WAL");
    Transaction tx(*db_, true);
    db_->exec(kSchema);
    // The final-transition log watches the queue's table, which exists by now.
    if (final_log) db_->exec(kFinalLog);
    tx.commit();
    SQLITE_CHECK(db_->get(),
                 sqlite3_busy_timeout(db_->get(), static_cast<int>(busy_timeout.count())));
  }

  int64_t record_cycle(const CycleRecord& c) override {
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

  std::vector<CycleRecord> cycles() override {
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

  int64_t add_request(const std::string& kind, int64_t now_ms) override {
    Transaction tx(*db_, true);
    Stmt& s = db_->prepare("INSERT INTO service_requests (kind, requested_at) VALUES (?1, ?2)");
    s.bind(1, std::string_view(kind)).bind(2, now_ms);
    s.step();
    const int64_t id = db_->last_insert_rowid();
    tx.commit();
    return id;
  }

  std::optional<int64_t> take_request(const std::string& kind, const std::string& worker,
                                      int64_t now_ms) override {
    // Polled often: a plain read first, and a write only when there is something to take. The
    // conditional UPDATE is atomic on its own, so two daemons never both take one request.
    Stmt& q = db_->prepare(
        "SELECT id FROM service_requests WHERE kind = ?1 AND taken_at IS NULL ORDER BY id LIMIT "
        "1");
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

  std::map<std::string, int64_t> job_counts() override {
    std::map<std::string, int64_t> out;
    Stmt& s = db_->prepare("SELECT state, count(*) FROM jobs GROUP BY state");
    while (s.step()) out[s.text(0)] = s.i64(1);
    s.reset();
    return out;
  }

  LatencySamples latency_samples() override {
    Stmt& s = db_->prepare(
        "SELECT l.queue_wait_ms, l.ttft_ms, l.total_ms, j.completion_tokens "
        "FROM job_latency l JOIN jobs j ON j.id = l.job_id");
    LatencySamples l;
    while (s.step()) {
      l.wait.push_back(static_cast<double>(s.i64(0)));
      l.ttft.push_back(static_cast<double>(s.opt_i64(1).value_or(0)));
      l.total.push_back(static_cast<double>(s.i64(2)));
      l.completion_tokens += s.opt_i64(3).value_or(0);
    }
    s.reset();
    return l;
  }

  void exec_producer_sql(const std::string& sql) override {
    Transaction tx(*db_, true);
    db_->exec(sql);
    tx.commit();
  }

  int64_t last_final_event() override {
    return db_->query_i64("SELECT coalesce(max(id), 0) FROM service_final_events");
  }

  std::vector<FinalEvent> final_events_after(int64_t seq, int64_t limit) override {
    Stmt& s = db_->prepare(
        "SELECT e.id, e.job_id, e.state, j.client_key, j.batch_id, j.error "
        "FROM service_final_events e LEFT JOIN jobs j ON j.id = e.job_id "
        "WHERE e.id > ?1 ORDER BY e.id LIMIT ?2");
    s.bind(1, seq).bind(2, limit);
    std::vector<FinalEvent> out;
    while (s.step()) {
      FinalEvent e;
      e.seq = s.i64(0);
      e.job_id = s.i64(1);
      e.state = s.text(2);
      e.client_key = s.opt_text(3);
      e.batch_id = s.opt_text(4);
      e.error = s.opt_text(5);
      out.push_back(std::move(e));
    }
    s.reset();
    return out;
  }

  int64_t prune_final_events(int64_t max_age_s) override {
    Stmt& s = db_->prepare(
        "DELETE FROM service_final_events WHERE at < CAST(strftime('%s', 'now') AS INTEGER) - "
        "?1");
    s.bind(1, max_age_s);
    s.step();
    s.reset();
    return db_->changes();
  }

 private:
  std::unique_ptr<Db> db_;
};

}  // namespace

std::unique_ptr<ServiceDbBackend> make_sqlite_service_db(const std::string& path,
                                                         std::chrono::milliseconds busy_timeout,
                                                         bool final_log) {
  return std::make_unique<SqliteServiceDb>(path, busy_timeout, final_log);
}

}  // namespace moebatch
