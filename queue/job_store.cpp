// JobStore: opening, migrations, submission and read paths. The lease protocol (claim, renew,
// complete, fail, release, cancel, requeue) lives in job_store_lease.cpp.
#include "queue/job_store.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "queue/job_row.h"
#include "queue/payload_hash.h"
#include "queue/schema.h"
#include "queue/sqlite_db.h"

namespace moebatch {
namespace {

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

int JobStore::schema_version_latest() {
  return static_cast<int>(parse_migrations(jobs_schema_sql()).size());
}

JobStore::JobStore(StoreOptions options) : options_(std::move(options)) {
  MB_CHECK(options_.clock != nullptr, "StoreOptions.clock must be set");
  MB_CHECK(options_.busy_timeout.count() >= 0 && options_.busy_timeout.count() <= 3600000,
           "busy_timeout must be within 0..1 h");
  db_ = std::make_unique<Db>(options_.path);
  // busy_timeout first: the pragmas and migrations below may wait on another process's lock.
  SQLITE_CHECK(db_->get(),
               sqlite3_busy_timeout(db_->get(), static_cast<int>(options_.busy_timeout.count())));
  Stmt& wal = db_->prepare("PRAGMA journal_mode=WAL");
  MB_CHECK(wal.step(), "journal_mode returned no row");
  std::string mode = wal.text(0);
  wal.reset();
  if (mode != "wal") {
    throw Error("job database '" + options_.path.string() +
                "' could not switch to WAL mode (got '" + mode + "')");
  }
  db_->exec(options_.synchronous == Synchronous::Full ? "PRAGMA synchronous=FULL"
                                                      : "PRAGMA synchronous=NORMAL");
  db_->exec("PRAGMA foreign_keys=ON");
  migrate();
}

JobStore::~JobStore() = default;

void JobStore::migrate() {
  const std::vector<Migration> migrations = parse_migrations(jobs_schema_sql());
  const auto latest = static_cast<int64_t>(migrations.size());
  int64_t current = schema_version();
  if (current > latest) {
    throw Error("job database '" + options_.path.string() + "' has schema version " +
                std::to_string(current) + ", newer than this build supports (" +
                std::to_string(latest) + ")");
  }
  for (const Migration& m : migrations) {
    if (m.version <= current) continue;
    Transaction tx(*db_, /*immediate=*/true);
    // Another process may have migrated while we waited for the write lock.
    current = schema_version();
    if (m.version <= current) continue;
    try {
      db_->exec(m.sql);
    } catch (const Error& e) {
      throw Error("migration to schema version " + std::to_string(m.version) + " of '" +
                  options_.path.string() + "' failed: " + e.what());
    }
    db_->exec("PRAGMA user_version = " + std::to_string(m.version));
    tx.commit();
    current = m.version;
  }
}

int64_t JobStore::schema_version() { return db_->query_i64("PRAGMA user_version"); }

int64_t JobStore::data_version() { return db_->query_i64("PRAGMA data_version"); }

SubmitResult JobStore::insert_one(const JobSpec& spec, size_t index) {
  const int64_t now = options_.clock->now_ms();
  std::optional<std::string> hash;  // only a key can come back, so only keyed jobs need one
  if (spec.client_key) {
    hash = job_payload_hash(spec);
    // Looked up first so a resubmission does not burn an AUTOINCREMENT id; inside the write
    // transaction nobody can insert the key between this check and the INSERT.
    Stmt& sel = db_->prepare("SELECT id, payload_hash FROM jobs WHERE client_key = ?1");
    sel.bind(1, spec.client_key);
    if (sel.step()) {
      const int64_t id = sel.i64(0);
      std::optional<std::string> stored = sel.opt_text(1);
      sel.reset();
      if (!stored) {
        // Rows from before payload hashes, or from plain-SQL producers: hash the row itself.
        std::optional<Job> existing = get(id);
        if (existing) stored = job_payload_hash(existing->spec);
      }
      if (stored != hash) throw KeyConflictError(*spec.client_key, id, index);
      return {id, false};
    }
    sel.reset();
  }
  // id is left out: the schema refuses an INSERT that names it (jobs.id is the queue's).
  Stmt& ins = db_->prepare(
      "INSERT INTO jobs (client_key, batch_id, custom_id, model, priority, prompt_kind, prompt, "
      "max_tokens, temperature, top_p, top_k, seed, stop, max_attempts, enqueued_at, not_before, "
      "chat_template_kwargs, payload_hash) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 0, ?16, ?17)");
  const SamplingParams& p = spec.sampling;
  ins.bind(1, spec.client_key).bind(2, spec.batch_id).bind(3, spec.custom_id).bind(4, spec.model);
  ins.bind(5, spec.priority).bind(6, prompt_kind_to_string(spec.prompt_kind));
  ins.bind(7, std::string_view(spec.prompt)).bind(8, p.max_tokens).bind(9, p.temperature);
  ins.bind(10, p.top_p).bind(11, p.top_k).bind(12, p.seed).bind(13, stop_list_to_json(p.stop));
  ins.bind(14, spec.max_attempts).bind(15, now).bind(16, spec.chat_template_kwargs);
  ins.bind(17, hash);
  ins.step();
  ins.reset();
  return {db_->last_insert_rowid(), true};
}

SubmitResult JobStore::submit(const JobSpec& spec) {
  validate_job_spec(spec, options_.limits);
  Transaction tx(*db_, /*immediate=*/true);
  SubmitResult r = insert_one(spec, 0);
  tx.commit();
  return r;
}

std::vector<SubmitResult> JobStore::submit_many(const std::vector<JobSpec>& specs,
                                                const std::function<void(size_t)>& progress) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (auto e = find_job_spec_error(specs[i], options_.limits)) {
      throw InputError("invalid job #" + std::to_string(i) + ": " + *e);
    }
  }
  std::vector<SubmitResult> out;
  out.reserve(specs.size());
  Transaction tx(*db_, /*immediate=*/true);
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(insert_one(specs[i], i));
    if (progress && (i + 1) % 4096 == 0) progress(i + 1);
  }
  tx.commit();
  if (progress) progress(specs.size());
  return out;
}

std::vector<Job> JobStore::read_jobs(const std::string& sql_suffix,
                                     const std::function<void(Stmt&)>& bind) {
  Stmt& s = db_->prepare(std::string("SELECT ") + kJobColumns + " FROM jobs " + sql_suffix);
  bind(s);
  std::vector<Job> out;
  while (s.step()) out.push_back(read_job_row(s).job);
  s.reset();
  return out;
}

std::optional<Job> JobStore::get(int64_t id) {
  auto v = read_jobs("WHERE id = ?1", [&](Stmt& s) { s.bind(1, id); });
  if (v.empty()) return std::nullopt;
  return std::move(v.front());
}

std::optional<Job> JobStore::get_by_key(const std::string& client_key) {
  auto v =
      read_jobs("WHERE client_key = ?1", [&](Stmt& s) { s.bind(1, std::string_view(client_key)); });
  if (v.empty()) return std::nullopt;
  return std::move(v.front());
}

std::vector<Job> JobStore::list(const ListFilter& f) {
  if (f.limit < 1 || f.limit > 100000) {
    throw InputError("list limit " + std::to_string(f.limit) + " is outside [1, 100000]");
  }
  std::optional<std::string> state;
  if (f.state) state = std::string(job_state_to_string(*f.state));
  return read_jobs(
      "WHERE id > ?1 AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR batch_id = ?3) "
      "ORDER BY id LIMIT ?4",
      [&](Stmt& s) { s.bind(1, f.after_id).bind(2, state).bind(3, f.batch_id).bind(4, f.limit); });
}

QueueStats JobStore::stats() {
  QueueStats st;
  for (JobState s : {JobState::Queued, JobState::Running, JobState::Done, JobState::Failed,
                     JobState::Cancelled}) {
    st.counts[s] = 0;
  }
  // One read transaction so counts and latencies describe the same snapshot.
  Transaction tx(*db_, /*immediate=*/false);
  Stmt& c = db_->prepare("SELECT state, COUNT(*) FROM jobs GROUP BY state");
  while (c.step()) {
    if (auto s = job_state_from_string(c.text(0))) st.counts[*s] = c.i64(1);
  }
  c.reset();
  std::vector<double> wait, ttft, total, tps;
  Stmt& l = db_->prepare("SELECT queue_wait_ms, ttft_ms, total_ms, tokens_per_s FROM job_latency");
  while (l.step()) {
    wait.push_back(static_cast<double>(l.i64(0)));
    if (auto v = l.opt_i64(1)) ttft.push_back(static_cast<double>(*v));
    total.push_back(static_cast<double>(l.i64(2)));
    if (auto v = l.opt_f64(3)) tps.push_back(*v);
  }
  l.reset();
  tx.commit();
  st.queue_wait_ms = percentiles_of(std::move(wait));
  st.ttft_ms = percentiles_of(std::move(ttft));
  st.total_ms = percentiles_of(std::move(total));
  st.tokens_per_s = percentiles_of(std::move(tps));
  return st;
}

}  // namespace moebatch
