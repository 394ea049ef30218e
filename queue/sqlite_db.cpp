#include "queue/sqlite_db.h"

#include <limits>

namespace moebatch {

void throw_sqlite_failure(sqlite3* db, int rc, std::string_view expr, const char* file, int line) {
  std::string msg = "SQLite call failed (";
  msg += expr;
  msg += "): ";
  // sqlite3_errmsg describes the last error on the connection; errstr covers a null db.
  msg += db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  msg += " [code " + std::to_string(rc) + "] at ";
  msg += file;
  msg += ":" + std::to_string(line);
  throw Error(msg);
}

Stmt::Stmt(sqlite3* db, std::string_view sql) : db_(db) {
  MB_CHECK(sql.size() < static_cast<size_t>(std::numeric_limits<int>::max()), "SQL too long");
  int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                              SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
  if (rc != SQLITE_OK) {
    throw Error("cannot prepare SQL '" + std::string(sql) + "': " + sqlite3_errmsg(db));
  }
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Stmt& Stmt::bind(int i, int64_t v) {
  SQLITE_CHECK(db_, sqlite3_bind_int64(stmt_, i, v));
  return *this;
}

Stmt& Stmt::bind(int i, double v) {
  SQLITE_CHECK(db_, sqlite3_bind_double(stmt_, i, v));
  return *this;
}

Stmt& Stmt::bind(int i, std::string_view v) {
  MB_CHECK(v.size() < static_cast<size_t>(std::numeric_limits<int>::max()), "text too long");
  SQLITE_CHECK(db_,
               sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  return *this;
}

Stmt& Stmt::bind(int i, const std::optional<std::string>& v) {
  return v ? bind(i, std::string_view(*v)) : bind_null(i);
}

Stmt& Stmt::bind(int i, const std::optional<int64_t>& v) { return v ? bind(i, *v) : bind_null(i); }

Stmt& Stmt::bind(int i, const std::optional<double>& v) { return v ? bind(i, *v) : bind_null(i); }

Stmt& Stmt::bind_null(int i) {
  SQLITE_CHECK(db_, sqlite3_bind_null(stmt_, i));
  return *this;
}

bool Stmt::step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw_sqlite_failure(db_, rc, sqlite3_sql(stmt_), __FILE__, __LINE__);
}

void Stmt::reset() {
  // reset returns the error of the previous step, already reported by step(); ignore it here.
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int Stmt::type(int col) const { return sqlite3_column_type(stmt_, col); }
int64_t Stmt::i64(int col) const { return sqlite3_column_int64(stmt_, col); }
double Stmt::f64(int col) const { return sqlite3_column_double(stmt_, col); }

std::string Stmt::text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}

size_t Stmt::text_bytes(int col) const {
  return static_cast<size_t>(sqlite3_column_bytes(stmt_, col));
}

std::optional<int64_t> Stmt::opt_i64(int col) const {
  if (type(col) == SQLITE_NULL) return std::nullopt;
  return i64(col);
}

std::optional<double> Stmt::opt_f64(int col) const {
  if (type(col) == SQLITE_NULL) return std::nullopt;
  return f64(col);
}

std::optional<std::string> Stmt::opt_text(int col) const {
  if (type(col) == SQLITE_NULL) return std::nullopt;
  return text(col);
}

Db::Db(const std::filesystem::path& path) {
  int rc =
      sqlite3_open_v2(path.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw Error("cannot open job database '" + path.string() + "': " + msg);
  }
  sqlite3_extended_result_codes(db_, 1);
}

Db::~Db() {
  cache_.clear();  // statements must be finalized before the connection closes
  sqlite3_close_v2(db_);
}

void Db::exec(std::string_view sql) {
  std::string s(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    throw Error("SQL failed (" + s.substr(0, 80) + "): " + msg + " [code " + std::to_string(rc) +
                "]");
  }
}

Stmt& Db::prepare(const std::string& sql) {
  auto it = cache_.find(sql);
  if (it == cache_.end()) it = cache_.emplace(sql, std::make_unique<Stmt>(db_, sql)).first;
  it->second->reset();
  return *it->second;
}

int64_t Db::query_i64(const std::string& sql) {
  Stmt& s = prepare(sql);
  MB_CHECK(s.step(), "query returned no row");
  int64_t v = s.i64(0);
  s.reset();
  return v;
}

int64_t Db::changes() const { return sqlite3_changes64(db_); }
int64_t Db::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }

Transaction::Transaction(Db& db, bool immediate) : db_(db) {
  db_.exec(immediate ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED");
}

Transaction::~Transaction() {
  if (!open_) return;
  // Destructors must not throw; a failed rollback leaves SQLite to roll back on close.
  sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  db_.exec("COMMIT");
  open_ = false;
}

}  // namespace moebatch
