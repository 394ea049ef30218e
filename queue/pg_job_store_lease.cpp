// PgJobStore: the lease protocol. Many hosts run it at once against one database:
//   - claim locks candidate rows with FOR UPDATE SKIP LOCKED: two claimers never wait on each
//     other nor take one row; rows another session is changing are simply left for later.
//   - requeueing expired leases locks its rows the same way, so every claimer may do it.
//   - every write under a lease is one UPDATE conditioned on state = 'running', the owner and
//     the fencing token; under READ COMMITTED PostgreSQL re-checks that condition on the newest
//     row version after any lock wait, so of two writers racing for one job at most one matches.
#include <map>

#include "common/error.h"
#include "queue/pg_job_store.h"

namespace moebatch {
namespace {

void check_worker_text(const std::string& worker) {
  if (auto p = pg_text_problem(worker)) throw InputError("worker id " + *p);
}

// Ids and tokens as two bigint[] parameters for unnest($n::bigint[], $m::bigint[]).
void add_leases(PgParams& p, const std::vector<LeaseRef>& leases) {
  std::vector<int64_t> ids, tokens;
  for (const LeaseRef& l : leases) {
    ids.push_back(l.id);
    tokens.push_back(l.token);
  }
  p.add_array(ids).add_array(tokens);
}

// "j is held by $3 under the token of t" for statements joining unnest(...) AS t(id, tok).
constexpr const char* kHeldByT =
    "j.id = t.id AND j.state = 'running' AND j.lease_owner = $3 AND (t.tok < 0 OR "
    "j.lease_token = t.tok)";

}  // namespace

int64_t PgJobStore::requeue_expired_locked(int64_t now) {
  // As in SQLite: attempts exhausted -> failed, otherwise back to queued. Rows another session
  // holds locked (it is finishing or renewing them right now) are skipped, not waited for.
  PgResult dead = conn_->exec(
      "UPDATE jobs SET state = 'failed', finished_at = $1, "
      "error = 'lease of ' || coalesce(lease_owner, '?') || ' expired after ' || attempts || "
      "' attempt(s); max_attempts reached', lease_owner = NULL, lease_expires_at = NULL "
      "WHERE id IN (SELECT id FROM jobs WHERE state = 'running' AND "
      "(lease_expires_at IS NULL OR lease_expires_at < $1) AND attempts >= max_attempts "
      "FOR UPDATE SKIP LOCKED)",
      PgParams().add(now));
  PgResult again = conn_->exec(
      "UPDATE jobs SET state = 'queued', not_before = $1, "
      "error = 'lease of ' || coalesce(lease_owner, '?') || ' expired', "
      "lease_owner = NULL, lease_expires_at = NULL "
      "WHERE id IN (SELECT id FROM jobs WHERE state = 'running' AND "
      "(lease_expires_at IS NULL OR lease_expires_at < $1) FOR UPDATE SKIP LOCKED)",
      PgParams().add(now));
  return dead.affected() + again.affected();
}

int64_t PgJobStore::requeue_expired(int64_t now) {
  PgTransaction tx(*conn_);
  const int64_t n = requeue_expired_locked(now);
  tx.commit();
  return n;
}

std::vector<Job> PgJobStore::claim(const std::string& worker, int64_t n, int64_t now,
                                   int64_t lease_len, const JobLimits& limits) {
  check_worker_text(worker);
  PgTransaction tx(*conn_);
  requeue_expired_locked(now);
  std::vector<Job> claimed;
  // Loop because invalid rows are failed and skipped; each pass fetches only what is missing.
  while (static_cast<int64_t>(claimed.size()) < n) {
    PgResult sel =
        conn_->exec(std::string("SELECT ") + kJobColumns +
                        " FROM jobs WHERE state = 'queued' AND not_before <= $1 "
                        "ORDER BY priority DESC, enqueued_at, id LIMIT $2 FOR UPDATE SKIP LOCKED",
                    PgParams().add(now).add(n - static_cast<int64_t>(claimed.size())));
    if (sel.rows() == 0) break;
    std::vector<Job> good;
    std::vector<int64_t> good_ids;
    for (int i = 0; i < sel.rows(); ++i) {
      JobRow row = read_pg_job_row(sel, i, limits);
      if (std::optional<std::string> err = claim_problem(row, limits)) {
        conn_->exec("UPDATE jobs SET state = 'failed', error = $2, finished_at = $3 WHERE id = $1",
                    PgParams().add(row.job.id).add(pg_text("invalid job row: " + *err)).add(now));
        continue;
      }
      good_ids.push_back(row.job.id);
      good.push_back(std::move(row.job));
    }
    if (good.empty()) continue;
    PgResult up = conn_->exec(
        "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = $2, "
        "lease_expires_at = $3, started_at = $4, lease_token = lease_token + 1 "
        "WHERE id = ANY($1::bigint[]) RETURNING id, lease_token",
        PgParams().add_array(good_ids).add(std::string_view(worker)).add(now + lease_len).add(now));
    std::map<int64_t, int64_t> token;
    for (int i = 0; i < up.rows(); ++i) token[up.i64(i, 0)] = up.i64(i, 1);
    for (Job& j : good) {
      auto it = token.find(j.id);
      if (it == token.end())
        throw Error("claimed job " + std::to_string(j.id) + " was not updated");
      j.state = JobState::Running;
      j.attempts += 1;
      j.lease_owner = worker;
      j.lease_expires_at = now + lease_len;
      j.started_at = now;
      j.lease_token = it->second;
      claimed.push_back(std::move(j));
    }
  }
  tx.commit();
  return claimed;
}

std::vector<int64_t> PgJobStore::not_held(const std::string& worker,
                                          const std::vector<LeaseRef>& leases) {
  if (leases.empty()) return {};
  if (pg_text_problem(worker)) {
    std::vector<int64_t> all;
    for (const LeaseRef& l : leases) all.push_back(l.id);
    return all;  // no row can name such an owner
  }
  PgParams p;
  add_leases(p, leases);
  p.add(std::string_view(worker));
  PgResult r =
      conn_->exec(std::string("SELECT t.id FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY "
                              "AS t(id, tok, ord) WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE ") +
                      kHeldByT + ") ORDER BY t.ord",
                  p);
  std::vector<int64_t> lost;
  for (int i = 0; i < r.rows(); ++i) lost.push_back(r.i64(i, 0));
  return lost;
}

int64_t PgJobStore::renew(const std::string& worker, const std::vector<LeaseRef>& leases,
                          int64_t until) {
  if (leases.empty() || pg_text_problem(worker)) return 0;
  PgParams p;
  add_leases(p, leases);
  p.add(std::string_view(worker)).add(until);
  return conn_
      ->exec(std::string("UPDATE jobs j SET lease_expires_at = $4 FROM unnest($1::bigint[], "
                         "$2::bigint[]) AS t(id, tok) WHERE ") +
                 kHeldByT,
             p)
      .affected();
}

std::vector<bool> PgJobStore::complete(const std::string& worker,
                                       const std::vector<Completion>& completions,
                                       const std::vector<int64_t>& tokens, int64_t now) {
  std::vector<bool> out(completions.size(), false);
  if (completions.empty() || pg_text_problem(worker)) return out;
  // One UPDATE for the group and one INSERT for its latency rows, whatever its size: a round
  // trip per statement is what a PostgreSQL queue pays for (bench/RESULTS.md, "Queue"). A job
  // listed twice is completed by its first entry.
  std::vector<int64_t> ids, toks, prompt, completion;
  std::vector<std::optional<int64_t>> first_token_at;
  std::vector<std::string> text, finish;
  std::map<int64_t, size_t> first_entry;
  for (size_t i = 0; i < completions.size(); ++i) {
    const Completion& c = completions[i];
    if (!first_entry.emplace(c.id, i).second) continue;
    ids.push_back(c.id);
    toks.push_back(tokens[i]);
    first_token_at.push_back(c.result.first_token_at);
    // Model output may end inside a UTF-8 sequence; PostgreSQL text must be valid UTF-8.
    text.push_back(pg_text(c.result.text));
    prompt.push_back(c.result.prompt_tokens);
    completion.push_back(c.result.completion_tokens);
    finish.push_back(pg_text(c.result.finish_reason));
  }
  PgTransaction tx(*conn_);
  PgParams up;
  up.add_array(ids).add_array(toks).add(std::string_view(worker)).add(now);
  up.add_array(first_token_at).add_array(text).add_array(prompt).add_array(completion);
  up.add_array(finish);
  PgResult landed = conn_->exec(
      std::string("UPDATE jobs j SET state = 'done', finished_at = $4, first_token_at = t.fta, "
                  "result_text = t.txt, prompt_tokens = t.pt, completion_tokens = t.ct, "
                  "finish_reason = t.fr, error = NULL, lease_owner = NULL, "
                  "lease_expires_at = NULL FROM unnest($1::bigint[], $2::bigint[], "
                  "$5::bigint[], $6::text[], $7::bigint[], $8::bigint[], $9::text[]) "
                  "AS t(id, tok, fta, txt, pt, ct, fr) WHERE ") +
          kHeldByT + " RETURNING j.id",
      up);
  if (landed.rows() == 0) return out;  // the transaction ends unchanged
  std::vector<int64_t> lat_ids, wait, total;
  std::vector<std::optional<int64_t>> ttft, decode;
  std::vector<std::optional<double>> rate;
  for (int r = 0; r < landed.rows(); ++r) {
    const auto it = first_entry.find(landed.i64(r, 0));
    if (it == first_entry.end()) throw Error("completed a job that was not in the group");
    out[it->second] = true;
    const Completion& c = completions[it->second];
    lat_ids.push_back(c.id);
    wait.push_back(c.latency.queue_wait_ms);
    ttft.push_back(c.latency.ttft_ms);
    decode.push_back(c.latency.decode_ms);
    total.push_back(c.latency.total_ms);
    rate.push_back(c.latency.tokens_per_s);
  }
  conn_->exec(
      "INSERT INTO job_latency (job_id, queue_wait_ms, ttft_ms, decode_ms, total_ms, "
      "tokens_per_s, recorded_at) SELECT t.*, $7 FROM unnest($1::bigint[], $2::bigint[], "
      "$3::bigint[], $4::bigint[], $5::bigint[], $6::float8[]) AS t "
      "ON CONFLICT (job_id) DO UPDATE SET queue_wait_ms = EXCLUDED.queue_wait_ms, "
      "ttft_ms = EXCLUDED.ttft_ms, decode_ms = EXCLUDED.decode_ms, "
      "total_ms = EXCLUDED.total_ms, tokens_per_s = EXCLUDED.tokens_per_s, "
      "recorded_at = EXCLUDED.recorded_at",
      PgParams()
          .add_array(lat_ids)
          .add_array(wait)
          .add_array(ttft)
          .add_array(decode)
          .add_array(total)
          .add_array(rate)
          .add(now));
  tx.commit();
  return out;
}

FailOutcome PgJobStore::fail(const std::string& worker, LeaseRef lease, const std::string& reason,
                             bool retryable, int64_t now, const RetryPolicy& retry) {
  if (pg_text_problem(worker)) return FailOutcome::NotOwner;
  PgTransaction tx(*conn_);
  PgResult sel = conn_->exec(
      "SELECT attempts, max_attempts FROM jobs WHERE id = $1 AND state = 'running' AND "
      "lease_owner = $2 AND ($3::bigint < 0 OR lease_token = $3) FOR UPDATE",
      PgParams().add(lease.id).add(std::string_view(worker)).add(lease.token));
  if (sel.rows() == 0) return FailOutcome::NotOwner;
  const int64_t attempts = sel.i64(0, 0);
  const int64_t max_attempts = sel.i64(0, 1);
  FailOutcome outcome;
  if (retryable && attempts < max_attempts) {
    conn_->exec(
        "UPDATE jobs SET state = 'queued', error = $2, not_before = $3, lease_owner = NULL, "
        "lease_expires_at = NULL WHERE id = $1",
        PgParams().add(lease.id).add(pg_text(reason)).add(now + retry_backoff_ms(retry, attempts)));
    outcome = FailOutcome::Retrying;
  } else {
    const std::string msg = retryable ? gave_up_message(reason, attempts) : reason;
    conn_->exec(
        "UPDATE jobs SET state = 'failed', error = $2, finished_at = $3, lease_owner = NULL, "
        "lease_expires_at = NULL WHERE id = $1",
        PgParams().add(lease.id).add(pg_text(msg)).add(now));
    outcome = FailOutcome::Failed;
  }
  tx.commit();
  return outcome;
}

std::vector<int64_t> PgJobStore::release(const std::string& worker,
                                         const std::vector<LeaseRef>& leases) {
  if (leases.empty() || pg_text_problem(worker)) return {};
  PgParams p;
  add_leases(p, leases);
  p.add(std::string_view(worker));
  // The attempt never ran to an outcome, so it is given back (attempts - 1).
  PgResult r = conn_->exec(
      std::string("UPDATE jobs j SET state = 'queued', attempts = greatest(j.attempts - 1, 0), "
                  "lease_owner = NULL, lease_expires_at = NULL FROM "
                  "unnest($1::bigint[], $2::bigint[]) AS t(id, tok) WHERE ") +
          kHeldByT + " RETURNING j.id",
      p);
  std::vector<int64_t> released;
  for (int i = 0; i < r.rows(); ++i) released.push_back(r.i64(i, 0));
  return released;
}

bool PgJobStore::cancel(int64_t id, int64_t now) {
  return conn_
             ->exec(
                 "UPDATE jobs SET state = 'cancelled', finished_at = $2, error = 'cancelled', "
                 "lease_owner = NULL, lease_expires_at = NULL "
                 "WHERE id = $1 AND state IN ('queued', 'running')",
                 PgParams().add(id).add(now))
             .affected() == 1;
}

}  // namespace moebatch
