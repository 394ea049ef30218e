// Thin RAII layer over the SQLite C API: a connection, prepared statements and transactions.
// Not thread-safe: one Db per thread (connections are opened with SQLITE_OPEN_NOMUTEX).
// Every failing call throws moebatch::Error through SQLITE_CHECK, naming the expression, the
// SQLite message, file and line.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"

namespace moebatch {

/// Formats "what (expr): sqlite message [code] at file:line" and throws Error.
[[noreturn]] void throw_sqlite_failure(sqlite3* db, int rc, std::string_view expr, const char* file,
                                       int line);

}  // namespace moebatch

/// Checks an SQLite call that must return SQLITE_OK: SQLITE_CHECK(db, sqlite3_exec(db, ...)).
#define SQLITE_CHECK(db, expr)                                                          \
  do {                                                                                  \
    int mb_sqlite_rc_ = (expr);                                                         \
    if (mb_sqlite_rc_ != SQLITE_OK)                                                     \
      ::moebatch::throw_sqlite_failure((db), mb_sqlite_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace moebatch {

/// One prepared statement. Reset (and bindings cleared) by reset(); reused through Db::prepare.
class Stmt {
 public:
  /// Prepares sql on db; throws Error naming the SQL on failure.
  Stmt(sqlite3* db, std::string_view sql);
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  /// Binds by 1-based index. nullopt binds NULL.
  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, double v);
  Stmt& bind(int i, std::string_view v);
  Stmt& bind(int i, const std::optional<std::string>& v);
  Stmt& bind(int i, const std::optional<int64_t>& v);
  Stmt& bind(int i, const std::optional<double>& v);
  Stmt& bind_null(int i);

  /// Steps once: true when a row is available, false when done. Throws on errors.
  bool step();
  /// Resets for reuse and clears bindings.
  void reset();

  /// Column readers (0-based). The optional forms map NULL to nullopt.
  int type(int col) const;
  int64_t i64(int col) const;
  double f64(int col) const;
  std::string text(int col) const;
  /// Bytes of a TEXT value (sqlite3_column_bytes), without copying it.
  size_t text_bytes(int col) const;
  std::optional<int64_t> opt_i64(int col) const;
  std::optional<double> opt_f64(int col) const;
  std::optional<std::string> opt_text(int col) const;

  /// Raw handle for the rare call this class does not wrap.
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

/// An open connection plus a cache of prepared statements keyed by their SQL text.
class Db {
 public:
  /// Opens (creating if needed) the file at path, read-write.
  explicit Db(const std::filesystem::path& path);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  /// Runs one or more statements without results (schema, pragmas, BEGIN/COMMIT).
  void exec(std::string_view sql);
  /// Returns the cached statement for sql, reset and ready to bind.
  Stmt& prepare(const std::string& sql);
  /// Value of a single-integer query such as "PRAGMA user_version".
  int64_t query_i64(const std::string& sql);
  /// Rows changed by the last INSERT/UPDATE/DELETE.
  int64_t changes() const;
  /// Rowid of the last successful INSERT.
  int64_t last_insert_rowid() const;
  /// Raw handle.
  sqlite3* get() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::map<std::string, std::unique_ptr<Stmt>, std::less<>> cache_;
};

/// RAII transaction: BEGIN IMMEDIATE (writer) or BEGIN DEFERRED (reader) in the constructor,
/// ROLLBACK in the destructor unless commit() ran.
class Transaction {
 public:
  /// immediate = true takes the write lock up front, so a writer never fails half-way with
  /// SQLITE_BUSY on lock upgrade (busy_timeout applies to the BEGIN instead).
  Transaction(Db& db, bool immediate);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  /// Commits; after this the destructor does nothing.
  void commit();

 private:
  Db& db_;
  bool open_ = true;
};

}  // namespace moebatch
