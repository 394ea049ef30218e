// JobStore: the database-independent half of the queue. Argument checks, spec validation, lease
// tokens and percentiles live here; the SQL of each database lives behind JobStoreBackend
// (sqlite_job_store*.cpp, pg_job_store*.cpp).
#include "queue/job_store.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "queue/job_store_backend.h"
#include "queue/schema.h"

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

Percentiles percentiles_of(std::vector<double> v) {
  Percentiles p;
  p.count = static_cast<int64_t>(v.size());
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  // Nearest-rank definition: the smallest value with at least q of the samples at or below it.
  auto rank = [&](double q) {
    auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(k, 1, v.size()) - 1];
  };
  p.p50 = rank(0.50);
  p.p90 = rank(0.90);
  p.p99 = rank(0.99);
  p.max = v.back();
  return p;
}

}  // namespace

int64_t retry_backoff_ms(const RetryPolicy& policy, int64_t attempts) {
  int64_t d = std::max<int64_t>(policy.base_backoff_ms, 0);
  for (int64_t i = 1; i < attempts && d < policy.max_backoff_ms; ++i) d *= 2;
  return std::min(d, policy.max_backoff_ms);
}

std::string gave_up_message(const std::string& reason, int64_t attempts) {
  return reason + " (gave up after " + std::to_string(attempts) + " attempts)";
}

int JobStore::schema_version_latest() { return schema_version_latest(StoreKind::Sqlite); }

int JobStore::schema_version_latest(StoreKind kind) {
  return static_cast<int>(
      parse_migrations(kind == StoreKind::Sqlite ? jobs_schema_sql() : jobs_pg_schema_sql())
          .size());
}

JobStore::JobStore(StoreOptions options) : options_(std::move(options)) {
  MB_CHECK(options_.clock != nullptr, "StoreOptions.clock must be set");
  MB_CHECK(options_.busy_timeout.count() >= 0 && options_.busy_timeout.count() <= 3600000,
           "busy_timeout must be within 0..1 h");
  MB_CHECK(options_.stats_latency_window >= 1 && options_.stats_latency_window <= 1000000,
           "stats_latency_window must be within 1..1000000");
  const StoreLocation loc = parse_store_location(options_.path.string());
  kind_ = loc.kind;
  backend_ = kind_ == StoreKind::Postgres ? make_pg_job_store(loc.target, options_)
                                          : make_sqlite_job_store(options_);
}

JobStore::~JobStore() = default;

int64_t JobStore::schema_version() { return backend_->schema_version(); }

int64_t JobStore::data_version() { return backend_->data_version(); }

SubmitResult JobStore::submit(const JobSpec& spec) {
  validate_job_spec(spec, options_.limits);
  return backend_->insert({spec}, options_.clock->now_ms(), {}).front();
}

std::vector<SubmitResult> JobStore::submit_many(const std::vector<JobSpec>& specs,
                                                const std::function<void(size_t)>& progress) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (auto e = find_job_spec_error(specs[i], options_.limits)) {
      throw InputError("invalid job #" + std::to_string(i) + ": " + *e);
    }
  }
  if (specs.empty()) return {};
  return backend_->insert(specs, options_.clock->now_ms(), progress);
}

std::optional<Job> JobStore::get(int64_t id) { return backend_->get(id); }

std::optional<Job> JobStore::get_by_key(const std::string& client_key) {
  return backend_->get_by_key(client_key);
}

std::vector<Job> JobStore::list(const ListFilter& f) {
  if (f.limit < 1 || f.limit > 100000) {
    throw InputError("list limit " + std::to_string(f.limit) + " is outside [1, 100000]");
  }
  return backend_->list(f);
}

int64_t JobStore::token_of(int64_t id) const {
  auto it = tokens_.find(id);
  return it == tokens_.end() ? -1 : it->second;
}

std::vector<LeaseRef> JobStore::leases_of(const std::vector<int64_t>& ids) const {
  std::vector<LeaseRef> out;
  out.reserve(ids.size());
  for (int64_t id : ids) out.push_back({id, token_of(id)});
  return out;
}

std::vector<Job> JobStore::claim(const std::string& worker, int64_t n,
                                 std::chrono::milliseconds lease) {
  check_worker(worker);
  if (n < 1 || n > 100000)
    throw InputError("claim count must be 1..100000, got " + std::to_string(n));
  std::vector<Job> jobs =
      backend_->claim(worker, n, options_.clock->now_ms(), lease_ms(lease), options_.limits);
  for (const Job& j : jobs) tokens_[j.id] = j.lease_token;
  return jobs;
}

int64_t JobStore::renew(const std::string& worker, const std::vector<int64_t>& ids,
                        std::chrono::milliseconds lease) {
  check_worker(worker);
  const int64_t until = options_.clock->now_ms() + lease_ms(lease);
  return backend_->renew(worker, leases_of(ids), until);
}

std::vector<int64_t> JobStore::not_held(const std::string& worker,
                                        const std::vector<int64_t>& ids) {
  check_worker(worker);
  // Lost leases keep their token here: a late complete of the same job must still be refused.
  return backend_->not_held(worker, leases_of(ids));
}

bool JobStore::complete(const std::string& worker, int64_t id, const JobResult& result,
                        const LatencyRecord& latency) {
  return complete_many(worker, {Completion{id, result, latency}}).front();
}

std::vector<bool> JobStore::complete_many(const std::string& worker,
                                          const std::vector<Completion>& completions) {
  check_worker(worker);
  if (completions.empty()) return {};
  std::vector<int64_t> tokens;
  tokens.reserve(completions.size());
  for (const Completion& c : completions) tokens.push_back(token_of(c.id));
  std::vector<bool> out = backend_->complete(worker, completions, tokens, options_.clock->now_ms());
  // A refused completion keeps its token, so a later write under the same stale lease is
  // refused too.
  for (size_t i = 0; i < completions.size(); ++i) {
    if (out[i]) forget(completions[i].id);
  }
  return out;
}

FailOutcome JobStore::fail(const std::string& worker, int64_t id, const std::string& reason,
                           bool retryable) {
  check_worker(worker);
  const FailOutcome out = backend_->fail(worker, {id, token_of(id)}, reason, retryable,
                                         options_.clock->now_ms(), options_.retry);
  if (out != FailOutcome::NotOwner) forget(id);
  return out;
}

int64_t JobStore::release(const std::string& worker, const std::vector<int64_t>& ids) {
  check_worker(worker);
  const std::vector<int64_t> released = backend_->release(worker, leases_of(ids));
  for (int64_t id : released) forget(id);
  return static_cast<int64_t>(released.size());
}

bool JobStore::cancel(int64_t id) { return backend_->cancel(id, options_.clock->now_ms()); }

std::optional<LatencyRecord> JobStore::latency(int64_t id) { return backend_->latency(id); }

BatchCounts JobStore::batch_counts(const std::string& batch_id) {
  BatchCounts c = backend_->batch_counts(batch_id);
  for (JobState s : {JobState::Queued, JobState::Running, JobState::Done, JobState::Failed,
                     JobState::Cancelled}) {
    c.counts.try_emplace(s, 0);
  }
  return c;
}

int64_t JobStore::cancel_batch(const std::string& batch_id) {
  return backend_->cancel_batch(batch_id, options_.clock->now_ms());
}

int64_t JobStore::retry_batch(const std::string& batch_id) {
  return backend_->retry_batch(batch_id, options_.clock->now_ms());
}

PurgeOutcome JobStore::purge_batch(const std::string& batch_id) {
  return backend_->purge_batch(batch_id);
}

int64_t JobStore::requeue_expired() { return backend_->requeue_expired(options_.clock->now_ms()); }

QueueStats JobStore::stats() {
  QueueStats st;
  for (JobState s : {JobState::Queued, JobState::Running, JobState::Done, JobState::Failed,
                     JobState::Cancelled}) {
    st.counts[s] = 0;
  }
  StatsSamples raw = backend_->stats(options_.stats_latency_window);
  // Done is every job in none of the other states (the schema's CHECK allows no sixth).
  int64_t done = raw.jobs;
  for (const auto& [state, n] : raw.counts) {
    if (state == JobState::Done) continue;
    st.counts[state] = n;
    done -= n;
  }
  st.counts[JobState::Done] = std::max<int64_t>(done, 0);
  st.latency_window = options_.stats_latency_window;
  st.queue_wait_ms = percentiles_of(std::move(raw.wait));
  st.ttft_ms = percentiles_of(std::move(raw.ttft));
  st.total_ms = percentiles_of(std::move(raw.total));
  st.tokens_per_s = percentiles_of(std::move(raw.tokens_s));
  return st;
}

}  // namespace moebatch
