// SqliteJobStore: operations on a whole batch (the jobs sharing one batch_id) and the latency
// record of one job. Each write is one BEGIN IMMEDIATE transaction, so a batch is changed all
// at once or not at all; the (batch_id, id) index keeps every statement off other batches.
#include "common/error.h"
#include "queue/sqlite_job_store.h"

namespace moebatch {
namespace {

// One UPDATE of a batch's jobs (?1 the batch id, ?2 now) in its own write transaction; the
// number of jobs it changed.
int64_t update_batch(Db& db, const char* sql, const std::string& batch_id, int64_t now) {
  Transaction tx(db, /*immediate=*/true);
  Stmt& up = db.prepare(sql);
  up.bind(1, std::string_view(batch_id)).bind(2, now);
  up.step();
  up.reset();
  const int64_t n = db.changes();
  tx.commit();
  return n;
}

}  // namespace

std::optional<LatencyRecord> SqliteJobStore::latency(int64_t id) {
  Stmt& s = db_->prepare(
      "SELECT queue_wait_ms, ttft_ms, decode_ms, total_ms, tokens_per_s FROM job_latency "
      "WHERE job_id = ?1");
  s.bind(1, id);
  std::optional<LatencyRecord> out;
  if (s.step()) out = LatencyRecord{s.i64(0), s.opt_i64(1), s.opt_i64(2), s.i64(3), s.opt_f64(4)};
  s.reset();
  return out;
}

BatchCounts SqliteJobStore::batch_counts(const std::string& batch_id) {
  BatchCounts c;
  Stmt& s = db_->prepare(
      "SELECT state, COUNT(*), COALESCE(SUM(prompt_tokens), 0), "
      "COALESCE(SUM(completion_tokens), 0), MIN(enqueued_at), MAX(finished_at) "
      "FROM jobs WHERE batch_id = ?1 GROUP BY state");
  s.bind(1, std::string_view(batch_id));
  while (s.step()) {
    const auto state = job_state_from_string(s.text(0));
    if (!state) continue;  // the CHECK constraint allows no other value
    c.counts[*state] = s.i64(1);
    c.total += s.i64(1);
    if (*state == JobState::Done) {
      c.prompt_tokens = s.i64(2);
      c.completion_tokens = s.i64(3);
    }
    if (auto t = s.opt_i64(4); t && (!c.first_enqueued_at || *t < *c.first_enqueued_at)) {
      c.first_enqueued_at = t;
    }
    if (auto t = s.opt_i64(5); t && (!c.last_finished_at || *t > *c.last_finished_at)) {
      c.last_finished_at = t;
    }
  }
  s.reset();
  return c;
}

int64_t SqliteJobStore::cancel_batch(const std::string& batch_id, int64_t now) {
  return update_batch(*db_,
                      "UPDATE jobs SET state = 'cancelled', finished_at = ?2, error = 'cancelled', "
                      "lease_owner = NULL, lease_expires_at = NULL "
                      "WHERE batch_id = ?1 AND state IN ('queued', 'running')",
                      batch_id, now);
}

int64_t SqliteJobStore::retry_batch(const std::string& batch_id, int64_t now) {
  // lease_token is kept: it only grows, so a write under any earlier lease stays refused.
  return update_batch(*db_,
                      "UPDATE jobs SET state = 'queued', attempts = 0, error = NULL, finished_at = NULL, "
                      "started_at = NULL, first_token_at = NULL, not_before = ?2 "
                      "WHERE batch_id = ?1 AND state = 'failed'",
                      batch_id, now);
}

PurgeOutcome SqliteJobStore::purge_batch(const std::string& batch_id) {
  Transaction tx(*db_, /*immediate=*/true);
  PurgeOutcome out;
  Stmt& open = db_->prepare(
      "SELECT COUNT(*) FROM jobs WHERE batch_id = ?1 AND state IN ('queued', 'running')");
  open.bind(1, std::string_view(batch_id));
  open.step();
  out.unfinished = open.i64(0);
  open.reset();
  if (out.unfinished > 0) return out;
  // job_latency rows go with their jobs (ON DELETE CASCADE; foreign_keys is on).
  Stmt& del = db_->prepare("DELETE FROM jobs WHERE batch_id = ?1");
  del.bind(1, std::string_view(batch_id));
  del.step();
  del.reset();
  out.deleted = db_->changes();
  tx.commit();
  return out;
}

}  // namespace moebatch
