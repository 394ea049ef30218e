// SqliteJobStore: the lease protocol. Every write runs in BEGIN IMMEDIATE, and every transition
// of a running job is conditioned on "state = 'running' AND lease_owner = worker" (and on the
// lease token when the caller has it), which is what makes the final result unique: once a
// lease expired and another worker claimed the job, or the job was cancelled or finished, the
// old owner's complete/fail/release/renew match no row.
#include "common/error.h"
#include "queue/job_row.h"
#include "queue/sqlite_job_store.h"

namespace moebatch {
namespace {

// The lease condition shared by every owner-only write: ?1 id, ?2 worker, ?3 token (-1: any).
constexpr const char* kHeld =
    "id = ?1 AND state = 'running' AND lease_owner = ?2 AND (?3 < 0 OR lease_token = ?3)";

}  // namespace

int64_t SqliteJobStore::requeue_expired_locked(int64_t now) {
  // Attempts exhausted: a job that keeps killing its worker must not loop forever. A running
  // row without a lease (only possible through a contract-breaking external insert) is treated
  // as expired too, so it cannot be stuck.
  Stmt& dead = db_->prepare(
      "UPDATE jobs SET state = 'failed', finished_at = ?1, "
      "error = 'lease of ' || coalesce(lease_owner, '?') || ' expired after ' || attempts || "
      "' attempt(s); max_attempts reached', lease_owner = NULL, lease_expires_at = NULL "
      "WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < ?1) "
      "AND attempts >= max_attempts");
  dead.bind(1, now);
  dead.step();
  dead.reset();
  int64_t changed = db_->changes();
  Stmt& again = db_->prepare(
      "UPDATE jobs SET state = 'queued', not_before = ?1, "
      "error = 'lease of ' || coalesce(lease_owner, '?') || ' expired', "
      "lease_owner = NULL, lease_expires_at = NULL "
      "WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < ?1)");
  again.bind(1, now);
  again.step();
  again.reset();
  return changed + db_->changes();
}

int64_t SqliteJobStore::requeue_expired(int64_t now) {
  Transaction tx(*db_, /*immediate=*/true);
  int64_t n = requeue_expired_locked(now);
  tx.commit();
  return n;
}

std::vector<Job> SqliteJobStore::claim(const std::string& worker, int64_t n, int64_t now,
                                       int64_t lease_len, const JobLimits& limits) {
  Transaction tx(*db_, /*immediate=*/true);
  requeue_expired_locked(now);
  std::vector<Job> claimed;
  // Loop because invalid rows are failed and skipped; each pass fetches only what is missing.
  while (static_cast<int64_t>(claimed.size()) < n) {
    Stmt& sel = db_->prepare(std::string("SELECT ") + kJobColumns +
                             " FROM jobs WHERE state = 'queued' AND not_before <= ?1 "
                             "ORDER BY priority DESC, enqueued_at, id LIMIT ?2");
    sel.bind(1, now).bind(2, n - static_cast<int64_t>(claimed.size()));
    std::vector<JobRow> rows;
    while (sel.step()) rows.push_back(read_job_row(sel, limits));
    sel.reset();
    if (rows.empty()) break;
    for (JobRow& row : rows) {
      if (std::optional<std::string> err = claim_problem(row, limits)) {
        Stmt& bad = db_->prepare(
            "UPDATE jobs SET state = 'failed', error = ?2, finished_at = ?3 WHERE id = ?1");
        bad.bind(1, row.job.id).bind(2, std::string_view("invalid job row: " + *err)).bind(3, now);
        bad.step();
        bad.reset();
        continue;
      }
      Stmt& up = db_->prepare(
          "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = ?2, "
          "lease_expires_at = ?3, started_at = ?4, lease_token = lease_token + 1 WHERE id = ?1");
      up.bind(1, row.job.id).bind(2, std::string_view(worker)).bind(3, now + lease_len);
      up.bind(4, now);
      up.step();
      up.reset();
      Job& j = row.job;
      j.state = JobState::Running;
      j.attempts += 1;
      j.lease_owner = worker;
      j.lease_expires_at = now + lease_len;
      j.started_at = now;
      j.lease_token += 1;
      claimed.push_back(std::move(j));
    }
  }
  tx.commit();
  return claimed;
}

std::vector<int64_t> SqliteJobStore::not_held(const std::string& worker,
                                              const std::vector<LeaseRef>& leases) {
  std::vector<int64_t> lost;
  Stmt& q = db_->prepare(std::string("SELECT 1 FROM jobs WHERE ") + kHeld);
  for (const LeaseRef& l : leases) {
    q.reset();
    q.bind(1, l.id).bind(2, std::string_view(worker)).bind(3, l.token);
    if (!q.step()) lost.push_back(l.id);
  }
  q.reset();
  return lost;
}

int64_t SqliteJobStore::renew(const std::string& worker, const std::vector<LeaseRef>& leases,
                              int64_t until) {
  Transaction tx(*db_, /*immediate=*/true);
  int64_t renewed = 0;
  Stmt& up = db_->prepare(std::string("UPDATE jobs SET lease_expires_at = ?4 WHERE ") + kHeld);
  for (const LeaseRef& l : leases) {
    up.reset();
    up.bind(1, l.id).bind(2, std::string_view(worker)).bind(3, l.token).bind(4, until);
    up.step();
    renewed += db_->changes();
  }
  up.reset();
  tx.commit();
  return renewed;
}

bool SqliteJobStore::complete_locked(const std::string& worker, const Completion& c, int64_t token,
                                     int64_t now) {
  Stmt& up = db_->prepare(
      std::string("UPDATE jobs SET state = 'done', finished_at = ?4, first_token_at = ?5, "
                  "result_text = ?6, prompt_tokens = ?7, completion_tokens = ?8, "
                  "finish_reason = ?9, error = NULL, lease_owner = NULL, "
                  "lease_expires_at = NULL WHERE ") +
      kHeld);
  up.bind(1, c.id).bind(2, std::string_view(worker)).bind(3, token).bind(4, now);
  up.bind(5, c.result.first_token_at).bind(6, std::string_view(c.result.text));
  up.bind(7, c.result.prompt_tokens).bind(8, c.result.completion_tokens);
  up.bind(9, std::string_view(c.result.finish_reason));
  up.step();
  up.reset();
  if (db_->changes() != 1) return false;
  const LatencyRecord& l = c.latency;
  Stmt& lat = db_->prepare(
      "INSERT OR REPLACE INTO job_latency (job_id, queue_wait_ms, ttft_ms, decode_ms, total_ms, "
      "tokens_per_s, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  lat.bind(1, c.id).bind(2, l.queue_wait_ms).bind(3, l.ttft_ms).bind(4, l.decode_ms);
  lat.bind(5, l.total_ms).bind(6, l.tokens_per_s).bind(7, now);
  lat.step();
  lat.reset();
  return true;
}

std::vector<bool> SqliteJobStore::complete(const std::string& worker,
                                           const std::vector<Completion>& completions,
                                           const std::vector<int64_t>& tokens, int64_t now) {
  std::vector<bool> out;
  out.reserve(completions.size());
  Transaction tx(*db_, /*immediate=*/true);
  for (size_t i = 0; i < completions.size(); ++i)
    out.push_back(complete_locked(worker, completions[i], tokens[i], now));
  tx.commit();
  return out;
}

FailOutcome SqliteJobStore::fail(const std::string& worker, LeaseRef lease,
                                 const std::string& reason, bool retryable, int64_t now,
                                 const RetryPolicy& retry) {
  Transaction tx(*db_, /*immediate=*/true);
  Stmt& sel = db_->prepare(std::string("SELECT attempts, max_attempts FROM jobs WHERE ") + kHeld);
  sel.bind(1, lease.id).bind(2, std::string_view(worker)).bind(3, lease.token);
  if (!sel.step()) {
    sel.reset();
    return FailOutcome::NotOwner;
  }
  const int64_t attempts = sel.i64(0);
  const int64_t max_attempts = sel.i64(1);
  sel.reset();
  FailOutcome outcome;
  if (retryable && attempts < max_attempts) {
    Stmt& up = db_->prepare(
        "UPDATE jobs SET state = 'queued', error = ?2, not_before = ?3, lease_owner = NULL, "
        "lease_expires_at = NULL WHERE id = ?1");
    up.bind(1, lease.id).bind(2, std::string_view(reason));
    up.bind(3, now + retry_backoff_ms(retry, attempts));
    up.step();
    up.reset();
    outcome = FailOutcome::Retrying;
  } else {
    const std::string msg = retryable ? gave_up_message(reason, attempts) : reason;
    Stmt& up = db_->prepare(
        "UPDATE jobs SET state = 'failed', error = ?2, finished_at = ?3, lease_owner = NULL, "
        "lease_expires_at = NULL WHERE id = ?1");
    up.bind(1, lease.id).bind(2, std::string_view(msg)).bind(3, now);
    up.step();
    up.reset();
    outcome = FailOutcome::Failed;
  }
  tx.commit();
  return outcome;
}

std::vector<int64_t> SqliteJobStore::release(const std::string& worker,
                                             const std::vector<LeaseRef>& leases) {
  Transaction tx(*db_, /*immediate=*/true);
  std::vector<int64_t> released;
  // The attempt never ran to an outcome, so it is given back (attempts - 1).
  Stmt& up =
      db_->prepare(std::string("UPDATE jobs SET state = 'queued', attempts = max(attempts - 1, 0), "
                               "lease_owner = NULL, lease_expires_at = NULL WHERE ") +
                   kHeld);
  for (const LeaseRef& l : leases) {
    up.reset();
    up.bind(1, l.id).bind(2, std::string_view(worker)).bind(3, l.token);
    up.step();
    if (db_->changes() > 0) released.push_back(l.id);
  }
  up.reset();
  tx.commit();
  return released;
}

bool SqliteJobStore::cancel(int64_t id, int64_t now) {
  Transaction tx(*db_, /*immediate=*/true);
  Stmt& up = db_->prepare(
      "UPDATE jobs SET state = 'cancelled', finished_at = ?2, error = 'cancelled', "
      "lease_owner = NULL, lease_expires_at = NULL "
      "WHERE id = ?1 AND state IN ('queued', 'running')");
  up.bind(1, id).bind(2, now);
  up.step();
  up.reset();
  bool ok = db_->changes() == 1;
  tx.commit();
  return ok;
}

}  // namespace moebatch
