// Plain-SQL access to a job database from the side, as an external producer, another process or
// an inspecting operator has it: its own connection, no JobStore. Only for test areas that link
// SQLite (queue, zmq, service).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace moebatch::test {

/// A raw connection to a database file (busy timeout 5 s), closed on destruction.
class SqlConnection {
 public:
  explicit SqlConnection(const std::filesystem::path& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
      const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw std::runtime_error("cannot open " + path.string() + ": " + msg);
    }
    sqlite3_busy_timeout(db_, 5000);
  }
  ~SqlConnection() { sqlite3_close(db_); }
  SqlConnection(const SqlConnection&) = delete;
  SqlConnection& operator=(const SqlConnection&) = delete;

  /// Runs sql (one or more statements); SQLite's error message, empty on success.
  std::string exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    const std::string msg = rc == SQLITE_OK ? "" : (err ? err : "error " + std::to_string(rc));
    sqlite3_free(err);
    return msg;
  }
  /// The first column of the first row of a query as an integer; -1 when there is no row or the
  /// query fails.
  int64_t query_i64(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
      v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
  }

 private:
  sqlite3* db_ = nullptr;
};

/// SqlConnection(path).exec(sql): SQLite's error message, empty on success.
inline std::string exec_sql(const std::filesystem::path& path, const std::string& sql) {
  return SqlConnection(path).exec(sql);
}

/// SqlConnection(path).query_i64(sql): a single integer, -1 when there is none.
inline int64_t query_i64(const std::filesystem::path& path, const std::string& sql) {
  return SqlConnection(path).query_i64(sql);
}

}  // namespace moebatch::test
