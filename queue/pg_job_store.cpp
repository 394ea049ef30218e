// PgJobStore: connecting, migrations, submission and read paths. The lease protocol (claim,
// renew, complete, fail, release, cancel, requeue) lives in pg_job_store_lease.cpp.
#include "queue/pg_job_store.h"

#include "common/error.h"
#include "queue/payload_hash.h"
#include "queue/schema.h"

namespace moebatch {
namespace {

// pg_advisory_xact_lock key of schema migrations: "moebatch" in ASCII.
constexpr const char* kMigrationLock = "SELECT pg_advisory_xact_lock(7885632945765245800)";

// Built-in type OIDs (catalog/pg_type.h), fixed since PostgreSQL 7.
enum : Oid {
  kInt8 = 20,
  kInt2 = 21,
  kInt4 = 23,
  kText = 25,
  kFloat4 = 700,
  kFloat8 = 701,
  kBpchar = 1042,
  kVarchar = 1043,
  kNumeric = 1700
};

// A result row as the job-row decoder sees it: types from the column's declared type.
class PgRow : public RowSource {
 public:
  PgRow(const PgResult& r, PGresult* raw, int row) : r_(r), raw_(raw), row_(row) {}
  Type type(int col) const override {
    if (r_.is_null(row_, col)) return Type::Null;
    switch (PQftype(raw_, col)) {
      case kInt8:
      case kInt2:
      case kInt4:
        return Type::Integer;
      case kFloat4:
      case kFloat8:
      case kNumeric:
        return Type::Real;
      case kText:
      case kVarchar:
      case kBpchar:
        return Type::Text;
      default:
        return Type::Other;
    }
  }
  int64_t i64(int col) const override { return r_.i64(row_, col); }
  double f64(int col) const override { return r_.f64(row_, col); }
  std::string text(int col) const override { return r_.text(row_, col); }
  size_t text_bytes(int col) const override {
    return static_cast<size_t>(PQgetlength(raw_, row_, col));
  }

 private:
  const PgResult& r_;
  PGresult* raw_;
  int row_;
};

// Producer text PostgreSQL cannot store is refused before anything is written.
void check_storable(const JobSpec& s, size_t index, size_t count) {
  auto check = [&](const char* field, const std::optional<std::string>& v) {
    if (!v) return;
    if (auto p = pg_text_problem(*v)) {
      throw InputError(
          (count > 1 ? "invalid job #" + std::to_string(index) : std::string("invalid job")) +
          ": " + field + ": " + *p);
    }
  };
  check("client_key", s.client_key);
  check("batch_id", s.batch_id);
  check("custom_id", s.custom_id);
  check("model", s.model);
  check("prompt", s.prompt);
  check("chat_template_kwargs", s.chat_template_kwargs);
  check("user", s.user);
  check("metadata", s.metadata);
  for (size_t i = 0; i < s.sampling.stop.size(); ++i) {
    check(("stop[" + std::to_string(i) + "]").c_str(), s.sampling.stop[i]);
  }
}

}  // namespace

JobRow read_pg_job_row(const PgResult& r, int row, const JobLimits& limits) {
  return decode_job_row(PgRow(r, r.raw(), row), limits);
}

int64_t pg_schema_version(PgConn& conn) {
  PgResult t = conn.exec("SELECT to_regclass('moebatch_schema') IS NOT NULL");
  if (t.text(0, 0) != "t") return 0;
  PgResult v = conn.exec("SELECT version FROM moebatch_schema");
  if (v.rows() != 1)
    throw Error("moebatch_schema holds " + std::to_string(v.rows()) + " rows, not 1");
  return v.i64(0, 0);
}

int64_t migrate_pg_schema(PgConn& conn, const std::string& where) {
  const std::vector<Migration> migrations = parse_migrations(jobs_pg_schema_sql());
  const auto latest = static_cast<int64_t>(migrations.size());
  {
    PgTransaction tx(conn);
    conn.exec(kMigrationLock);
    conn.exec("CREATE TABLE IF NOT EXISTS moebatch_schema (version bigint NOT NULL)");
    if (conn.exec("SELECT 1 FROM moebatch_schema").rows() == 0)
      conn.exec("INSERT INTO moebatch_schema (version) VALUES (0)");
    tx.commit();
  }
  int64_t current = pg_schema_version(conn);
  if (current > latest) {
    throw Error("job database " + where + " has schema version " + std::to_string(current) +
                ", newer than this build supports (" + std::to_string(latest) + ")");
  }
  for (const Migration& m : migrations) {
    if (m.version <= current) continue;
    PgTransaction tx(conn);
    conn.exec(kMigrationLock);
    // Another host may have migrated while we waited for the lock.
    current = pg_schema_version(conn);
    if (m.version <= current) continue;
    try {
      conn.exec(m.sql);
    } catch (const Error& e) {
      throw Error("migration to schema version " + std::to_string(m.version) + " of " + where +
                  " failed: " + e.what());
    }
    conn.exec("UPDATE moebatch_schema SET version = " + std::to_string(m.version));
    tx.commit();
    current = m.version;
  }
  return current;
}

std::unique_ptr<JobStoreBackend> make_pg_job_store(const std::string& url,
                                                   const StoreOptions& options) {
  return std::make_unique<PgJobStore>(url, options);
}

PgJobStore::PgJobStore(const std::string& url, const StoreOptions& options)
    : conn_(std::make_unique<PgConn>(url)), limits_(options.limits) {
  // lock_timeout is PostgreSQL's counterpart of SQLite's busy_timeout: how long a statement
  // waits for another session's lock (a row being cancelled, a migration) before failing.
  const std::string setup = "SET lock_timeout = " + std::to_string(options.busy_timeout.count()) +
                            "; LISTEN moebatch_jobs";
  conn_->exec(setup);
  conn_->set_session_setup(setup);
  migrate_pg_schema(*conn_, store_location_for_display(url));
}

int64_t PgJobStore::schema_version() { return pg_schema_version(*conn_); }

int64_t PgJobStore::data_version() {
  const int self = conn_->backend_pid();
  for (int pid : conn_->take_notifications()) {
    if (pid != self) ++notices_;
  }
  return notices_;
}

SubmitResult PgJobStore::insert_one(const JobSpec& spec, size_t index, int64_t now) {
  std::optional<std::string> hash;
  auto existing = [&]() -> std::optional<SubmitResult> {
    PgResult r = conn_->exec("SELECT id, payload_hash FROM jobs WHERE client_key = $1",
                             PgParams().add(spec.client_key));
    if (r.rows() == 0) return std::nullopt;
    const int64_t id = r.i64(0, 0);
    std::optional<std::string> stored = r.opt_text(0, 1);
    if (!stored) {
      // Rows from plain-SQL producers carry no hash: hash the row itself.
      if (std::optional<Job> j = get(id)) stored = job_payload_hash(j->spec);
    }
    if (stored != hash) throw KeyConflictError(*spec.client_key, id, index);
    return SubmitResult{id, false};
  };
  if (spec.client_key) {
    hash = job_payload_hash(spec);
    // Looked up first so a resubmission does not use up an identity value.
    if (auto r = existing()) return *r;
  }
  const SamplingParams& p = spec.sampling;
  PgParams params;
  params.add(spec.client_key).add(spec.batch_id).add(spec.custom_id).add(spec.model);
  params.add(spec.priority).add(prompt_kind_to_string(spec.prompt_kind));
  params.add(std::string_view(spec.prompt)).add(p.max_tokens).add(p.temperature);
  params.add(p.top_p).add(p.top_k).add(p.seed).add(stop_list_to_json(p.stop));
  params.add(spec.max_attempts).add(now).add(spec.chat_template_kwargs).add(hash);
  params.add(spec.user).add(spec.metadata);
  // A key inserted by another session since the lookup: ON CONFLICT waits for that session to
  // end, inserts nothing, and the key is then looked up again.
  PgResult r = conn_->exec(
      "INSERT INTO jobs (client_key, batch_id, custom_id, model, priority, prompt_kind, prompt, "
      "max_tokens, temperature, top_p, top_k, seed, stop, max_attempts, enqueued_at, not_before, "
      "chat_template_kwargs, payload_hash, end_user, metadata) "
      "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 0, $16, $17, $18, "
      "$19) "
      "ON CONFLICT (client_key) DO NOTHING RETURNING id",
      params);
  if (r.rows() == 1) return {r.i64(0, 0), true};
  if (auto again = existing()) return *again;
  throw Error("job with client_key '" + spec.client_key.value_or("") +
              "' neither inserted nor found");
}

std::vector<SubmitResult> PgJobStore::insert(const std::vector<JobSpec>& specs, int64_t now,
                                             const std::function<void(size_t)>& progress) {
  for (size_t i = 0; i < specs.size(); ++i) check_storable(specs[i], i, specs.size());
  std::vector<SubmitResult> out;
  out.reserve(specs.size());
  PgTransaction tx(*conn_);
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(insert_one(specs[i], i, now));
    if (progress && (i + 1) % 4096 == 0) progress(i + 1);
  }
  tx.commit();
  if (progress) progress(specs.size());
  return out;
}

std::vector<Job> PgJobStore::read_jobs(const std::string& sql_suffix, const PgParams& params) {
  PgResult r =
      conn_->exec(std::string("SELECT ") + kJobColumns + " FROM jobs " + sql_suffix, params);
  std::vector<Job> out;
  out.reserve(static_cast<size_t>(r.rows()));
  for (int i = 0; i < r.rows(); ++i) out.push_back(read_pg_job_row(r, i, limits_).job);
  return out;
}

std::optional<Job> PgJobStore::get(int64_t id) {
  auto v = read_jobs("WHERE id = $1", PgParams().add(id));
  if (v.empty()) return std::nullopt;
  return std::move(v.front());
}

std::optional<Job> PgJobStore::get_by_key(const std::string& client_key) {
  if (pg_text_problem(client_key)) return std::nullopt;  // no stored key can hold it
  auto v = read_jobs("WHERE client_key = $1", PgParams().add(std::string_view(client_key)));
  if (v.empty()) return std::nullopt;
  return std::move(v.front());
}

std::vector<Job> PgJobStore::list(const ListFilter& f) {
  if (f.batch_id && pg_text_problem(*f.batch_id)) return {};
  std::optional<std::string> state;
  if (f.state) state = std::string(job_state_to_string(*f.state));
  return read_jobs(
      "WHERE id > $1 AND ($2::text IS NULL OR state = $2) AND ($3::text IS NULL OR batch_id = $3) "
      "ORDER BY id LIMIT $4",
      PgParams().add(f.after_id).add(state).add(f.batch_id).add(f.limit));
}

StatsSamples PgJobStore::stats(int64_t latency_window) {
  StatsSamples st;
  // One snapshot so counts and latencies agree; every statement reads an index only
  // (stats_sql, job_store_backend.h; count(*) an index-only scan of the primary key).
  PgTransaction tx(*conn_, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  st.jobs = conn_->exec(stats_sql::kAll).i64(0, 0);
  st.counts[JobState::Queued] = conn_->exec(stats_sql::kQueued).i64(0, 0);
  st.counts[JobState::Running] = conn_->exec(stats_sql::kRunning).i64(0, 0);
  PgResult c = conn_->exec(stats_sql::kFailedOrCancelled);
  for (int i = 0; i < c.rows(); ++i) {
    if (auto s = job_state_from_string(c.text(i, 0))) st.counts[*s] = c.i64(i, 1);
  }
  PgResult l =
      conn_->exec(std::string(stats_sql::kLatencyNewest) + "$1", PgParams().add(latency_window));
  for (int i = 0; i < l.rows(); ++i) {
    st.wait.push_back(static_cast<double>(l.i64(i, 0)));
    if (auto v = l.opt_i64(i, 1)) st.ttft.push_back(static_cast<double>(*v));
    st.total.push_back(static_cast<double>(l.i64(i, 2)));
    if (auto v = l.opt_f64(i, 3)) st.tokens_s.push_back(*v);
  }
  tx.commit();
  return st;
}

}  // namespace moebatch
