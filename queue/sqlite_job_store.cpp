// SqliteJobStore: opening, migrations, submission and read paths. The lease protocol (claim,
// renew, complete, fail, release, cancel, requeue) lives in sqlite_job_store_lease.cpp.
#include "queue/sqlite_job_store.h"

#include "common/error.h"
#include "queue/job_row.h"
#include "queue/payload_hash.h"
#include "queue/schema.h"

namespace moebatch {

std::unique_ptr<JobStoreBackend> make_sqlite_job_store(const StoreOptions& options) {
  return std::make_unique<SqliteJobStore>(options);
}

SqliteJobStore::SqliteJobStore(const StoreOptions& options)
    : path_(options.path.string()),
      db_(std::make_unique<Db>(options.path)),
      limits_(options.limits) {
  // busy_timeout first: the pragmas and migrations below may wait on another process's lock.
  SQLITE_CHECK(db_->get(),
               sqlite3_busy_timeout(db_->get(), static_cast<int>(options.busy_timeout.count())));
  Stmt& wal = db_->prepare("PRAGMA journal_mode=WAL");
  MB_CHECK(wal.step(), "journal_mode returned no row");
  std::string mode = wal.text(0);
  wal.reset();
  if (mode != "wal") {
    throw Error("job database '" + path_ + "' could not switch to WAL mode (got '" + mode + "')");
  }
  db_->exec(options.synchronous == Synchronous::Full ? "PRAGMA synchronous=FULL"
                                                     : "PRAGMA synchronous=NORMAL");
  db_->exec("PRAGMA foreign_keys=ON");
  migrate();
}

void SqliteJobStore::migrate() {
  const std::vector<Migration> migrations = parse_migrations(jobs_schema_sql());
  const auto latest = static_cast<int64_t>(migrations.size());
  int64_t current = schema_version();
  if (current > latest) {
    throw Error("job database '" + path_ + "' has schema version " + std::to_string(current) +
                ", newer than this build supports (" + std::to_string(latest) + ")");
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
      throw Error("migration to schema version " + std::to_string(m.version) + " of '" + path_ +
                  "' failed: " + e.what());
    }
    db_->exec("PRAGMA user_version = " + std::to_string(m.version));
    tx.commit();
    current = m.version;
  }
}

int64_t SqliteJobStore::schema_version() { return db_->query_i64("PRAGMA user_version"); }

int64_t SqliteJobStore::data_version() { return db_->query_i64("PRAGMA data_version"); }

SubmitResult SqliteJobStore::insert_one(const JobSpec& spec, size_t index, int64_t now) {
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
      "chat_template_kwargs, payload_hash, end_user, metadata) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 0, ?16, ?17, ?18, "
      "?19)");
  const SamplingParams& p = spec.sampling;
  ins.bind(1, spec.client_key).bind(2, spec.batch_id).bind(3, spec.custom_id).bind(4, spec.model);
  ins.bind(5, spec.priority).bind(6, prompt_kind_to_string(spec.prompt_kind));
  ins.bind(7, std::string_view(spec.prompt)).bind(8, p.max_tokens).bind(9, p.temperature);
  ins.bind(10, p.top_p).bind(11, p.top_k).bind(12, p.seed).bind(13, stop_list_to_json(p.stop));
  ins.bind(14, spec.max_attempts).bind(15, now).bind(16, spec.chat_template_kwargs);
  ins.bind(17, hash).bind(18, spec.user).bind(19, spec.metadata);
  ins.step();
  ins.reset();
  return {db_->last_insert_rowid(), true};
}

std::vector<SubmitResult> SqliteJobStore::insert(const std::vector<JobSpec>& specs, int64_t now,
                                                 const std::function<void(size_t)>& progress) {
  std::vector<SubmitResult> out;
  out.reserve(specs.size());
  Transaction tx(*db_, /*immediate=*/true);
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(insert_one(specs[i], i, now));
    if (progress && (i + 1) % 4096 == 0) progress(i + 1);
  }
  tx.commit();
  if (progress) progress(specs.size());
  return out;
}

std::vector<Job> SqliteJobStore::read_jobs(const std::string& sql_suffix,
                                           const std::function<void(Stmt&)>& bind) {
  Stmt& s = db_->prepare(std::string("SELECT ") + kJobColumns + " FROM jobs " + sql_suffix);
  bind(s);
  std::vector<Job> out;
  while (s.step()) out.push_back(read_job_row(s, limits_).job);
  s.reset();
  return out;
}

std::optional<Job> SqliteJobStore::get(int64_t id) {
  auto v = read_jobs("WHERE id = ?1", [&](Stmt& s) { s.bind(1, id); });
  if (v.empty()) return std::nullopt;
  return std::move(v.front());
}

std::optional<Job> SqliteJobStore::get_by_key(const std::string& client_key) {
  auto v =
      read_jobs("WHERE client_key = ?1", [&](Stmt& s) { s.bind(1, std::string_view(client_key)); });
  if (v.empty()) return std::nullopt;
  return std::move(v.front());
}

std::vector<Job> SqliteJobStore::list(const ListFilter& f) {
  std::optional<std::string> state;
  if (f.state) state = std::string(job_state_to_string(*f.state));
  return read_jobs(
      "WHERE id > ?1 AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR batch_id = ?3) "
      "ORDER BY id LIMIT ?4",
      [&](Stmt& s) { s.bind(1, f.after_id).bind(2, state).bind(3, f.batch_id).bind(4, f.limit); });
}

StatsSamples SqliteJobStore::stats(int64_t latency_window) {
  StatsSamples st;
  // One read transaction so counts and latencies describe the same snapshot; every statement
  // reads an index only (stats_sql, job_store_backend.h).
  Transaction tx(*db_, /*immediate=*/false);
  st.jobs = db_->query_i64(stats_sql::kAll);
  st.counts[JobState::Queued] = db_->query_i64(stats_sql::kQueued);
  st.counts[JobState::Running] = db_->query_i64(stats_sql::kRunning);
  Stmt& c = db_->prepare(stats_sql::kFailedOrCancelled);
  while (c.step()) {
    if (auto s = job_state_from_string(c.text(0))) st.counts[*s] = c.i64(1);
  }
  c.reset();
  // job_id is the table's rowid: the newest rows are the end of its b-tree.
  Stmt& l = db_->prepare(std::string(stats_sql::kLatencyNewest) + "?1");
  l.bind(1, latency_window);
  while (l.step()) {
    st.wait.push_back(static_cast<double>(l.i64(0)));
    if (auto v = l.opt_i64(1)) st.ttft.push_back(static_cast<double>(*v));
    st.total.push_back(static_cast<double>(l.i64(2)));
    if (auto v = l.opt_f64(3)) st.tokens_s.push_back(*v);
  }
  l.reset();
  tx.commit();
  return st;
}

}  // namespace moebatch
