// Thin RAII layer over libpq: a connection, query results, parameters and transactions.
// Not thread-safe: one PgConn per thread. Every failing call throws PgError, which carries the
// SQLSTATE (e.g. "23505" unique_violation) so callers can tell a constraint from an outage.
// Parameters and results travel in libpq's text format; numbers are written and parsed with
// std::to_chars / std::from_chars (locale-independent, doubles round-trip exactly).
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace moebatch {

/// A libpq failure: the server's message, the SQL it ran (first 120 bytes) and the SQLSTATE.
class PgError : public Error {
 public:
  PgError(const std::string& msg, std::string sqlstate)
      : Error(msg), sqlstate_(std::move(sqlstate)) {}
  /// Five-character SQLSTATE, empty when the failure was not reported by the server.
  const std::string& sqlstate() const { return sqlstate_; }

 private:
  std::string sqlstate_;
};

/// Positional parameters $1, $2, ... in text format; nullopt is SQL NULL.
class PgParams {
 public:
  PgParams& add(int64_t v);
  PgParams& add(double v);
  PgParams& add(std::string_view v);
  PgParams& add(const std::string& v) { return add(std::string_view(v)); }
  PgParams& add(const char* v) { return add(std::string_view(v)); }
  PgParams& add(const std::optional<std::string>& v);
  PgParams& add(const std::optional<int64_t>& v);
  PgParams& add(const std::optional<double>& v);
  PgParams& add_null();
  /// A bigint[] literal ('{1,2,3}').
  PgParams& add_array(const std::vector<int64_t>& v);
  /// Array literals for unnest(): bigint[] and float8[] with NULL for nullopt, text[] (cast
  /// the parameter in the statement: $n::bigint[], $n::float8[], $n::text[]).
  PgParams& add_array(const std::vector<std::optional<int64_t>>& v);
  PgParams& add_array(const std::vector<std::optional<double>>& v);
  PgParams& add_array(const std::vector<std::string>& v);
  /// Number of parameters so far.
  size_t size() const { return values_.size(); }
  /// Values for PQexecParams.
  const std::vector<std::optional<std::string>>& values() const { return values_; }

 private:
  std::vector<std::optional<std::string>> values_;
};

/// One query result (owns the PGresult). Column readers validate what the server sent.
class PgResult {
 public:
  explicit PgResult(PGresult* r) : r_(r) {}
  ~PgResult() { PQclear(r_); }
  PgResult(PgResult&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
  PgResult& operator=(PgResult&& o) noexcept;
  PgResult(const PgResult&) = delete;
  PgResult& operator=(const PgResult&) = delete;

  /// Rows returned.
  int rows() const { return PQntuples(r_); }
  /// Rows changed by an INSERT/UPDATE/DELETE (PQcmdTuples).
  int64_t affected() const;
  bool is_null(int row, int col) const { return PQgetisnull(r_, row, col) != 0; }
  /// Text of a column (empty for NULL).
  std::string text(int row, int col) const;
  /// An integer column; Error naming the column when the text is not a 64-bit integer.
  int64_t i64(int row, int col) const;
  /// A floating-point column; Error when the text is not a number.
  double f64(int row, int col) const;
  std::optional<std::string> opt_text(int row, int col) const;
  std::optional<int64_t> opt_i64(int row, int col) const;
  std::optional<double> opt_f64(int row, int col) const;
  /// The column's name, for messages.
  std::string column_name(int col) const;
  /// Raw handle (column types: PQftype).
  PGresult* raw() const { return r_; }

 private:
  PGresult* r_;
};

/// An open connection. Reconnects (PQreset) before a statement when the connection was lost, so
/// a store outlives a server restart; the failed call itself still throws.
class PgConn {
 public:
  /// Connects with a libpq connection string or postgresql:// URL. Error (without the
  /// password) when the server cannot be reached.
  explicit PgConn(const std::string& conninfo);
  ~PgConn();
  PgConn(const PgConn&) = delete;
  PgConn& operator=(const PgConn&) = delete;

  /// Runs one or more statements without parameters (schema, SET, BEGIN/COMMIT).
  PgResult exec(const std::string& sql);
  /// Runs one statement with parameters $1..$n (text format, types inferred by the server:
  /// cast in the SQL where they cannot be, e.g. `$1::text IS NULL`).
  PgResult exec(const std::string& sql, const PgParams& params);
  /// The server process serving this connection (NOTIFY senders are told apart by it).
  int backend_pid() const { return PQbackendPID(conn_); }
  /// Reads pending input and returns the notifications received since the last call, as the
  /// sending backends' pids. Never blocks.
  std::vector<int> take_notifications();
  /// Statements to run again after a reconnect (LISTEN, SET).
  void set_session_setup(std::string sql) { session_setup_ = std::move(sql); }
  /// Raw handle.
  PGconn* get() const { return conn_; }

 private:
  void ensure_connected();
  PgResult check(PGresult* r, const std::string& sql);

  PGconn* conn_ = nullptr;
  std::string session_setup_;
  std::string where_;  // "host/db" for messages, never the password
};

/// RAII transaction: BEGIN in the constructor, ROLLBACK in the destructor unless commit() ran.
class PgTransaction {
 public:
  /// begin_sql: "BEGIN" or e.g. "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY".
  explicit PgTransaction(PgConn& c, const char* begin_sql = "BEGIN");
  ~PgTransaction();
  PgTransaction(const PgTransaction&) = delete;
  PgTransaction& operator=(const PgTransaction&) = delete;
  void commit();

 private:
  PgConn& c_;
  bool open_ = true;
};

/// s with every byte sequence PostgreSQL's UTF8 text cannot hold (invalid UTF-8, NUL) replaced
/// by U+FFFD. For text the service produces (model output, error messages); producer input is
/// refused instead (see pg_text_problem).
std::string pg_text(std::string_view s);
/// Why s cannot be stored as PostgreSQL text ("contains a NUL byte", "is not valid UTF-8"), or
/// nullopt.
std::optional<std::string> pg_text_problem(std::string_view s);

}  // namespace moebatch
