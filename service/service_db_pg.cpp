// ServiceDb on PostgreSQL: the tables are migration 2 of schemas/jobs_pg.sql (the constructor
// migrates, as every store opening the database does); the daemon adds the final-transition
// trigger. Inserting a service request sends NOTIFY moebatch_jobs (a trigger of the migration),
// so every daemon's data_version moves and one of them takes it.
#include "common/error.h"
#include "queue/pg_conn.h"
#include "queue/pg_job_store.h"
#include "queue/store_url.h"
#include "service/service_db_backend.h"

namespace moebatch {
namespace {

// Created by the daemon under the migrations' advisory lock, so daemons starting together
// create it once. A row trigger with a WHEN clause runs only for final transitions; AFTER row
// triggers fire at the end of their statement, after every row of it is locked.
constexpr const char* kFinalLogTrigger = R"sql(
SELECT pg_advisory_xact_lock(7885632945765245800);
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_trigger
                 WHERE tgname = 'service_final_event' AND tgrelid = 'jobs'::regclass) THEN
    CREATE TRIGGER service_final_event AFTER UPDATE OF state ON jobs FOR EACH ROW
      WHEN (NEW.state IN ('done', 'failed', 'cancelled')
            AND OLD.state NOT IN ('done', 'failed', 'cancelled'))
      EXECUTE FUNCTION moebatch_final_event();
  END IF;
END $$;
)sql";

class PgServiceDb final : public ServiceDbBackend {
 public:
  PgServiceDb(const std::string& url, std::chrono::milliseconds busy_timeout, bool final_log)
      : conn_(std::make_unique<PgConn>(url)) {
    const std::string where = store_location_for_display(url);
    conn_->exec("SET lock_timeout = 5000");
    migrate_pg_schema(*conn_, where);
    if (final_log) {
      PgTransaction tx(*conn_);
      conn_->exec(kFinalLogTrigger);
      tx.commit();
    }
    // Like SQLite's busy_timeout: how long a write waits for another session's lock before it
    // fails (SQLSTATE 55P03). Re-applied after a reconnect.
    const std::string setup = "SET lock_timeout = " + std::to_string(busy_timeout.count());
    conn_->set_session_setup(setup);
    conn_->exec(setup);
  }

  int64_t record_cycle(const CycleRecord& c) override {
    PgParams p;
    p.add(pg_text(c.worker)).add(c.trigger).add(c.started_at).add(c.ended_at);
    p.add(c.downtime_ms).add(c.drained).add(c.requeued).add(c.mem_before).add(c.mem_after);
    p.add(c.warmup_ms).add(c.result);
    p.add(c.error.empty() ? std::optional<std::string>() : std::optional(pg_text(c.error)));
    PgResult r = conn_->exec(
        "INSERT INTO service_cycles (worker, trigger, started_at, ended_at, downtime_ms, drained, "
        "requeued, mem_before, mem_after, warmup_ms, result, error) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
        p);
    return r.i64(0, 0);
  }

  std::vector<CycleRecord> cycles() override {
    PgResult r = conn_->exec(
        "SELECT id, worker, trigger, started_at, ended_at, downtime_ms, drained, requeued, "
        "mem_before, mem_after, warmup_ms, result, error FROM service_cycles ORDER BY id");
    std::vector<CycleRecord> out;
    for (int i = 0; i < r.rows(); ++i) {
      CycleRecord c;
      c.id = r.i64(i, 0);
      c.worker = r.text(i, 1);
      c.trigger = r.text(i, 2);
      c.started_at = r.i64(i, 3);
      c.ended_at = r.i64(i, 4);
      c.downtime_ms = r.i64(i, 5);
      c.drained = r.i64(i, 6);
      c.requeued = r.i64(i, 7);
      c.mem_before = r.i64(i, 8);
      c.mem_after = r.i64(i, 9);
      c.warmup_ms = r.i64(i, 10);
      c.result = r.text(i, 11);
      c.error = r.opt_text(i, 12).value_or("");
      out.push_back(std::move(c));
    }
    return out;
  }

  int64_t add_request(const std::string& kind, int64_t now_ms) override {
    PgResult r = conn_->exec(
        "INSERT INTO service_requests (kind, requested_at) VALUES ($1, $2) RETURNING id",
        PgParams().add(kind).add(now_ms));
    return r.i64(0, 0);
  }

  std::optional<int64_t> take_request(const std::string& kind, const std::string& worker,
                                      int64_t now_ms) override {
    // Polled at every change notice: a plain read first, a write only when there is something.
    PgResult q = conn_->exec(
        "SELECT id FROM service_requests WHERE kind = $1 AND taken_at IS NULL ORDER BY id "
        "LIMIT 1",
        PgParams().add(kind));
    if (q.rows() == 0) return std::nullopt;
    const int64_t id = q.i64(0, 0);
    // Under READ COMMITTED the condition is re-checked on the newest row version after a row
    // lock wait, so of two daemons at most one takes it.
    PgResult u = conn_->exec(
        "UPDATE service_requests SET taken_by = $2, taken_at = $3 WHERE id = $1 AND taken_at IS "
        "NULL",
        PgParams().add(id).add(pg_text(worker)).add(now_ms));
    if (u.affected() != 1) return std::nullopt;
    return id;
  }

  std::map<std::string, int64_t> job_counts() override {
    PgResult r = conn_->exec("SELECT state, count(*) FROM jobs GROUP BY state");
    std::map<std::string, int64_t> out;
    for (int i = 0; i < r.rows(); ++i) out[r.text(i, 0)] = r.i64(i, 1);
    return out;
  }

  LatencySamples latency_samples() override {
    PgResult r = conn_->exec(
        "SELECT l.queue_wait_ms, l.ttft_ms, l.total_ms, j.completion_tokens "
        "FROM job_latency l JOIN jobs j ON j.id = l.job_id");
    LatencySamples l;
    for (int i = 0; i < r.rows(); ++i) {
      l.wait.push_back(static_cast<double>(r.i64(i, 0)));
      l.ttft.push_back(static_cast<double>(r.opt_i64(i, 1).value_or(0)));
      l.total.push_back(static_cast<double>(r.i64(i, 2)));
      l.completion_tokens += r.opt_i64(i, 3).value_or(0);
    }
    return l;
  }

  void exec_producer_sql(const std::string& sql) override {
    PgTransaction tx(*conn_);
    conn_->exec(sql);
    tx.commit();
  }

  int64_t last_final_event() override {
    return conn_->exec("SELECT coalesce(max(id), 0) FROM service_final_events").i64(0, 0);
  }

  std::vector<FinalEvent> final_events_after(int64_t seq, int64_t limit) override {
    PgResult r = conn_->exec(
        "SELECT e.id, e.job_id, e.state, j.client_key, j.batch_id, j.error "
        "FROM service_final_events e LEFT JOIN jobs j ON j.id = e.job_id "
        "WHERE e.id > $1 ORDER BY e.id LIMIT $2",
        PgParams().add(seq).add(limit));
    std::vector<FinalEvent> out;
    for (int i = 0; i < r.rows(); ++i) {
      FinalEvent e;
      e.seq = r.i64(i, 0);
      e.job_id = r.i64(i, 1);
      e.state = r.text(i, 2);
      e.client_key = r.opt_text(i, 3);
      e.batch_id = r.opt_text(i, 4);
      e.error = r.opt_text(i, 5);
      out.push_back(std::move(e));
    }
    return out;
  }

  int64_t prune_final_events(int64_t max_age_s) override {
    return conn_
        ->exec(
            "DELETE FROM service_final_events "
            "WHERE at < floor(extract(epoch FROM clock_timestamp()))::bigint - $1",
            PgParams().add(max_age_s))
        .affected();
  }

 private:
  std::unique_ptr<PgConn> conn_;
};

}  // namespace

std::unique_ptr<ServiceDbBackend> make_pg_service_db(const std::string& url,
                                                     std::chrono::milliseconds busy_timeout,
                                                     bool final_log) {
  return std::make_unique<PgServiceDb>(url, busy_timeout, final_log);
}

}  // namespace moebatch
