// PgJobStore: operations on a whole batch (the jobs sharing one batch_id) and the latency record
// of one job. Each write is one statement or one transaction, so a batch changes all at once;
// rows a claimer holds locked are waited for (lock_timeout), not skipped, so no job of the batch
// is left behind.
#include "common/error.h"
#include "queue/pg_job_store.h"

namespace moebatch {

std::optional<LatencyRecord> PgJobStore::latency(int64_t id) {
  PgResult r = conn_->exec(
      "SELECT queue_wait_ms, ttft_ms, decode_ms, total_ms, tokens_per_s FROM job_latency "
      "WHERE job_id = $1",
      PgParams().add(id));
  if (r.rows() == 0) return std::nullopt;
  return LatencyRecord{r.i64(0, 0), r.opt_i64(0, 1), r.opt_i64(0, 2), r.i64(0, 3), r.opt_f64(0, 4)};
}

BatchCounts PgJobStore::batch_counts(const std::string& batch_id) {
  BatchCounts c;
  if (pg_text_problem(batch_id)) return c;  // no stored batch id can hold it
  PgResult r = conn_->exec(
      "SELECT state, count(*), coalesce(sum(prompt_tokens), 0)::bigint, "
      "coalesce(sum(completion_tokens), 0)::bigint, min(enqueued_at), max(finished_at) "
      "FROM jobs WHERE batch_id = $1 GROUP BY state",
      PgParams().add(std::string_view(batch_id)));
  for (int i = 0; i < r.rows(); ++i) {
    const auto state = job_state_from_string(r.text(i, 0));
    if (!state) continue;  // the CHECK constraint allows no other value
    c.counts[*state] = r.i64(i, 1);
    c.total += r.i64(i, 1);
    if (*state == JobState::Done) {
      c.prompt_tokens = r.i64(i, 2);
      c.completion_tokens = r.i64(i, 3);
    }
    if (auto t = r.opt_i64(i, 4); t && (!c.first_enqueued_at || *t < *c.first_enqueued_at)) {
      c.first_enqueued_at = t;
    }
    if (auto t = r.opt_i64(i, 5); t && (!c.last_finished_at || *t > *c.last_finished_at)) {
      c.last_finished_at = t;
    }
  }
  return c;
}

int64_t PgJobStore::cancel_batch(const std::string& batch_id, int64_t now) {
  if (pg_text_problem(batch_id)) return 0;
  return conn_
      ->exec(
          "UPDATE jobs SET state = 'cancelled', finished_at = $2, error = 'cancelled', "
          "lease_owner = NULL, lease_expires_at = NULL "
          "WHERE batch_id = $1 AND state IN ('queued', 'running')",
          PgParams().add(std::string_view(batch_id)).add(now))
      .affected();
}

int64_t PgJobStore::retry_batch(const std::string& batch_id, int64_t now) {
  if (pg_text_problem(batch_id)) return 0;
  // lease_token is kept: it only grows, so a write under any earlier lease stays refused.
  return conn_
      ->exec(
          "UPDATE jobs SET state = 'queued', attempts = 0, error = NULL, finished_at = NULL, "
          "started_at = NULL, first_token_at = NULL, not_before = $2 "
          "WHERE batch_id = $1 AND state = 'failed'",
          PgParams().add(std::string_view(batch_id)).add(now))
      .affected();
}

PurgeOutcome PgJobStore::purge_batch(const std::string& batch_id) {
  PurgeOutcome out;
  if (pg_text_problem(batch_id)) return out;
  PgTransaction tx(*conn_);
  // Locking the batch's rows first keeps a claim from starting one between the check and the
  // DELETE.
  PgResult rows = conn_->exec("SELECT state FROM jobs WHERE batch_id = $1 FOR UPDATE",
                              PgParams().add(std::string_view(batch_id)));
  for (int i = 0; i < rows.rows(); ++i) {
    const std::string s = rows.text(i, 0);
    if (s == "queued" || s == "running") ++out.unfinished;
  }
  if (out.unfinished > 0) return out;
  // job_latency rows go with their jobs (ON DELETE CASCADE).
  out.deleted =
      conn_
          ->exec("DELETE FROM jobs WHERE batch_id = $1", PgParams().add(std::string_view(batch_id)))
          .affected();
  tx.commit();
  return out;
}

}  // namespace moebatch
