// JobStore: the lease protocol. Every write runs in BEGIN IMMEDIATE, and every transition of a
// running job is conditioned on "state = 'running' AND lease_owner = worker", which is what makes
// the final result unique: once a lease expired and another worker claimed the job, or the job
// was cancelled or finished, the old owner's complete/fail/release/renew match no row.
#include <algorithm>

#include "common/error.h"
#include "queue/job_row.h"
#include "queue/job_store.h"
#include "queue/sqlite_db.h"

namespace moebatch {
namespace {

void check_worker(const std::string& worker) {
  if (worker.empty() || worker.size() > 256) {
    throw InputError("worker id must be 1..256 bytes, got " + std::to_string(worker.size()));
  }
}

int64_t lease_ms(std::chrono::milliseconds lease) {
  // A day is far beyond any sane lease; the bound keeps now + lease from overflowing.
  if (lease.count() < 1 || lease.count() > 86400000) {
    throw InputError("lease must be 1 ms .. 24 h, got " + std::to_string(lease.count()) + " ms");
  }
  return lease.count();
}

int64_t backoff_ms(const RetryPolicy& policy, int64_t attempts) {
  int64_t d = std::max<int64_t>(policy.base_backoff_ms, 0);
  for (int64_t i = 1; i < attempts && d < policy.max_backoff_ms; ++i) d *= 2;
  return std::min(d, policy.max_backoff_ms);
}

}  // namespace

int64_t JobStore::requeue_expired_locked(int64_t now) {
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

int64_t JobStore::requeue_expired() {
  Transaction tx(*db_, /*immediate=*/true);
  int64_t n = requeue_expired_locked(options_.clock->now_ms());
  tx.commit();
  return n;
}

std::vector<Job> JobStore::claim(const std::string& worker, int64_t n,
                                 std::chrono::milliseconds lease) {
  check_worker(worker);
  if (n < 1 || n > 100000)
    throw InputError("claim count must be 1..100000, got " + std::to_string(n));
  const int64_t lease_len = lease_ms(lease);
  const int64_t now = options_.clock->now_ms();
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
    while (sel.step()) rows.push_back(read_job_row(sel));
    sel.reset();
    if (rows.empty()) break;
    for (JobRow& row : rows) {
      std::optional<std::string> err = row.error;
      if (!err) err = find_job_spec_error(row.job.spec, options_.limits);
      if (!err && row.job.attempts >= row.job.spec.max_attempts) {
        err = "attempts: " + std::to_string(row.job.attempts) + " already reaches max_attempts " +
              std::to_string(row.job.spec.max_attempts);
      }
      if (err) {
        Stmt& bad = db_->prepare(
            "UPDATE jobs SET state = 'failed', error = ?2, finished_at = ?3 WHERE id = ?1");
        bad.bind(1, row.job.id).bind(2, std::string_view("invalid job row: " + *err)).bind(3, now);
        bad.step();
        bad.reset();
        continue;
      }
      Stmt& up = db_->prepare(
          "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = ?2, "
          "lease_expires_at = ?3, started_at = ?4 WHERE id = ?1");
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
      claimed.push_back(std::move(j));
    }
  }
  tx.commit();
  return claimed;
}

std::vector<int64_t> JobStore::not_held(const std::string& worker,
                                        const std::vector<int64_t>& ids) {
  check_worker(worker);
  std::vector<int64_t> lost;
  Stmt& q = db_->prepare(
      "SELECT 1 FROM jobs WHERE id = ?1 AND state = 'running' AND lease_owner = ?2");
  for (int64_t id : ids) {
    q.reset();
    q.bind(1, id).bind(2, std::string_view(worker));
    if (!q.step()) lost.push_back(id);
  }
  q.reset();
  return lost;
}

int64_t JobStore::renew(const std::string& worker, const std::vector<int64_t>& ids,
                        std::chrono::milliseconds lease) {
  check_worker(worker);
  const int64_t until = options_.clock->now_ms() + lease_ms(lease);
  Transaction tx(*db_, /*immediate=*/true);
  int64_t renewed = 0;
  Stmt& up = db_->prepare(
      "UPDATE jobs SET lease_expires_at = ?3 "
      "WHERE id = ?1 AND state = 'running' AND lease_owner = ?2");
  for (int64_t id : ids) {
    up.reset();
    up.bind(1, id).bind(2, std::string_view(worker)).bind(3, until);
    up.step();
    renewed += db_->changes();
  }
  up.reset();
  tx.commit();
  return renewed;
}

bool JobStore::complete_locked(const std::string& worker, const Completion& c, int64_t now) {
  Stmt& up = db_->prepare(
      "UPDATE jobs SET state = 'done', finished_at = ?3, first_token_at = ?4, result_text = ?5, "
      "prompt_tokens = ?6, completion_tokens = ?7, finish_reason = ?8, error = NULL, "
      "lease_owner = NULL, lease_expires_at = NULL "
      "WHERE id = ?1 AND state = 'running' AND lease_owner = ?2");
  up.bind(1, c.id).bind(2, std::string_view(worker)).bind(3, now).bind(4, c.result.first_token_at);
  up.bind(5, std::string_view(c.result.text)).bind(6, c.result.prompt_tokens);
  up.bind(7, c.result.completion_tokens).bind(8, std::string_view(c.result.finish_reason));
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

bool JobStore::complete(const std::string& worker, int64_t id, const JobResult& result,
                        const LatencyRecord& latency) {
  check_worker(worker);
  Transaction tx(*db_, /*immediate=*/true);
  bool ok = complete_locked(worker, Completion{id, result, latency}, options_.clock->now_ms());
  tx.commit();
  return ok;
}

std::vector<bool> JobStore::complete_many(const std::string& worker,
                                          const std::vector<Completion>& completions) {
  check_worker(worker);
  const int64_t now = options_.clock->now_ms();
  std::vector<bool> out;
  out.reserve(completions.size());
  Transaction tx(*db_, /*immediate=*/true);
  for (const Completion& c : completions) out.push_back(complete_locked(worker, c, now));
  tx.commit();
  return out;
}

FailOutcome JobStore::fail(const std::string& worker, int64_t id, const std::string& reason,
                           bool retryable) {
  check_worker(worker);
  const int64_t now = options_.clock->now_ms();
  Transaction tx(*db_, /*immediate=*/true);
  Stmt& sel = db_->prepare(
      "SELECT attempts, max_attempts FROM jobs "
      "WHERE id = ?1 AND state = 'running' AND lease_owner = ?2");
  sel.bind(1, id).bind(2, std::string_view(worker));
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
    up.bind(1, id).bind(2, std::string_view(reason));
    up.bind(3, now + backoff_ms(options_.retry, attempts));
    up.step();
    up.reset();
    outcome = FailOutcome::Retrying;
  } else {
    std::string msg = reason;
    if (retryable) msg += " (gave up after " + std::to_string(attempts) + " attempts)";
    Stmt& up = db_->prepare(
        "UPDATE jobs SET state = 'failed', error = ?2, finished_at = ?3, lease_owner = NULL, "
        "lease_expires_at = NULL WHERE id = ?1");
    up.bind(1, id).bind(2, std::string_view(msg)).bind(3, now);
    up.step();
    up.reset();
    outcome = FailOutcome::Failed;
  }
  tx.commit();
  return outcome;
}

int64_t JobStore::release(const std::string& worker, const std::vector<int64_t>& ids) {
  check_worker(worker);
  Transaction tx(*db_, /*immediate=*/true);
  int64_t released = 0;
  // The attempt never ran to an outcome, so it is given back (attempts - 1).
  Stmt& up = db_->prepare(
      "UPDATE jobs SET state = 'queued', attempts = max(attempts - 1, 0), lease_owner = NULL, "
      "lease_expires_at = NULL WHERE id = ?1 AND state = 'running' AND lease_owner = ?2");
  for (int64_t id : ids) {
    up.reset();
    up.bind(1, id).bind(2, std::string_view(worker));
    up.step();
    released += db_->changes();
  }
  up.reset();
  tx.commit();
  return released;
}

bool JobStore::cancel(int64_t id) {
  Transaction tx(*db_, /*immediate=*/true);
  Stmt& up = db_->prepare(
      "UPDATE jobs SET state = 'cancelled', finished_at = ?2, error = 'cancelled', "
      "lease_owner = NULL, lease_expires_at = NULL "
      "WHERE id = ?1 AND state IN ('queued', 'running')");
  up.bind(1, id).bind(2, options_.clock->now_ms());
  up.step();
  up.reset();
  bool ok = db_->changes() == 1;
  tx.commit();
  return ok;
}

}  // namespace moebatch
