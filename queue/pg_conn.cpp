#include "queue/pg_conn.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "queue/job_validate.h"

namespace moebatch {
namespace {

std::string trimmed(const char* msg) {
  std::string s = msg ? msg : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Appends the UTF-8 encoding of U+FFFD.
void append_replacement(std::string& out) { out += "\xEF\xBF\xBD"; }

// Length of the well-formed UTF-8 sequence starting at s[i], 0 when there is none.
size_t utf8_len_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80             ? 1
                     : (c & 0xE0) == 0xC0 ? 2
                     : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4
                                          : 0;
  if (len == 0 || i + len > s.size()) return 0;
  return is_valid_utf8(s.substr(i, len)) ? len : 0;
}

// A double as PostgreSQL reads it back exactly (its spellings of to_chars' "inf" and "nan").
std::string double_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  MB_CHECK(ec == std::errc(), "double does not fit its text buffer");
  return std::string(buf, end);
}

// An array literal of n elements: each quoted (backslash before '"' and '\\'), so any text
// is one element, or an unquoted NULL where elem(i) gives nullopt.
template <typename Elem>
std::string array_literal(size_t n, Elem elem) {
  std::string s = "{";
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ',';
    const std::optional<std::string> e = elem(i);
    if (!e) {
      s += "NULL";
      continue;
    }
    s += '"';
    for (char c : *e) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    s += '"';
  }
  return s + '}';
}

}  // namespace

PgParams& PgParams::add(int64_t v) {
  values_.emplace_back(std::to_string(v));
  return *this;
}

PgParams& PgParams::add(double v) {
  values_.emplace_back(double_text(v));
  return *this;
}

PgParams& PgParams::add(std::string_view v) {
  values_.emplace_back(std::string(v));
  return *this;
}

PgParams& PgParams::add(const std::optional<std::string>& v) {
  return v ? add(std::string_view(*v)) : add_null();
}
PgParams& PgParams::add(const std::optional<int64_t>& v) { return v ? add(*v) : add_null(); }
PgParams& PgParams::add(const std::optional<double>& v) { return v ? add(*v) : add_null(); }

PgParams& PgParams::add_null() {
  values_.emplace_back(std::nullopt);
  return *this;
}

PgParams& PgParams::add_array(const std::vector<int64_t>& v) {
  values_.emplace_back(array_literal(
      v.size(), [&](size_t i) -> std::optional<std::string> { return std::to_string(v[i]); }));
  return *this;
}

PgParams& PgParams::add_array(const std::vector<std::optional<int64_t>>& v) {
  values_.emplace_back(array_literal(v.size(), [&](size_t i) -> std::optional<std::string> {
    return v[i] ? std::optional(std::to_string(*v[i])) : std::nullopt;
  }));
  return *this;
}

PgParams& PgParams::add_array(const std::vector<std::optional<double>>& v) {
  values_.emplace_back(array_literal(v.size(), [&](size_t i) -> std::optional<std::string> {
    return v[i] ? std::optional(double_text(*v[i])) : std::nullopt;
  }));
  return *this;
}

PgParams& PgParams::add_array(const std::vector<std::string>& v) {
  values_.emplace_back(
      array_literal(v.size(), [&](size_t i) -> std::optional<std::string> { return v[i]; }));
  return *this;
}

PgResult& PgResult::operator=(PgResult&& o) noexcept {
  if (this != &o) {
    PQclear(r_);
    r_ = o.r_;
    o.r_ = nullptr;
  }
  return *this;
}

int64_t PgResult::affected() const {
  const char* n = PQcmdTuples(r_);
  int64_t v = 0;
  if (!n || !*n) return 0;
  auto [end, ec] = std::from_chars(n, n + std::strlen(n), v);
  if (ec != std::errc())
    throw Error(std::string("PostgreSQL row count '") + n + "' is not a number");
  (void)end;
  return v;
}

std::string PgResult::column_name(int col) const {
  const char* n = PQfname(r_, col);
  return n ? n : "column " + std::to_string(col);
}

std::string PgResult::text(int row, int col) const {
  return std::string(PQgetvalue(r_, row, col), static_cast<size_t>(PQgetlength(r_, row, col)));
}

int64_t PgResult::i64(int row, int col) const {
  const char* p = PQgetvalue(r_, row, col);
  const char* e = p + PQgetlength(r_, row, col);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(p, e, v);
  if (ec != std::errc() || end != e || p == e) {
    throw Error("PostgreSQL column " + column_name(col) + ": '" + std::string(p, e) +
                "' is not a 64-bit integer");
  }
  return v;
}

double PgResult::f64(int row, int col) const {
  const char* p = PQgetvalue(r_, row, col);
  const char* e = p + PQgetlength(r_, row, col);
  double v = 0;
  auto [end, ec] = std::from_chars(p, e, v);
  if (ec != std::errc() || end != e || p == e) {
    throw Error("PostgreSQL column " + column_name(col) + ": '" + std::string(p, e) +
                "' is not a number");
  }
  return v;
}

std::optional<std::string> PgResult::opt_text(int row, int col) const {
  if (is_null(row, col)) return std::nullopt;
  return text(row, col);
}
std::optional<int64_t> PgResult::opt_i64(int row, int col) const {
  if (is_null(row, col)) return std::nullopt;
  return i64(row, col);
}
std::optional<double> PgResult::opt_f64(int row, int col) const {
  if (is_null(row, col)) return std::nullopt;
  return f64(row, col);
}

PgConn::PgConn(const std::string& conninfo) {
  conn_ = PQconnectdb(conninfo.c_str());
  if (!conn_) throw Error("cannot allocate a PostgreSQL connection");
  if (PQstatus(conn_) != CONNECTION_OK) {
    // PQerrorMessage names host and user, never the password.
    std::string msg = trimmed(PQerrorMessage(conn_));
    PQfinish(conn_);
    conn_ = nullptr;
    throw PgError("cannot connect to PostgreSQL: " + msg, "");
  }
  where_ = std::string(PQdb(conn_)) + " on " + (PQhost(conn_) ? PQhost(conn_) : "?");
  // Replies in a fixed language-independent form; the store's times are its own epoch-ms
  // integers, so the session time zone does not matter.
  exec("SET client_encoding = 'UTF8'; SET client_min_messages = warning");
}

PgConn::~PgConn() { PQfinish(conn_); }

void PgConn::ensure_connected() {
  if (PQstatus(conn_) == CONNECTION_OK) return;
  PQreset(conn_);
  if (PQstatus(conn_) != CONNECTION_OK) {
    throw PgError("PostgreSQL connection to " + where_ + " lost: " + trimmed(PQerrorMessage(conn_)),
                  "08006");
  }
  PgResult r = check(
      PQexec(conn_, "SET client_encoding = 'UTF8'; SET client_min_messages = warning"), "SET");
  if (!session_setup_.empty()) check(PQexec(conn_, session_setup_.c_str()), session_setup_);
}

PgResult PgConn::check(PGresult* r, const std::string& sql) {
  PgResult res(r);
  const ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return res;
  std::string state;
  std::string msg;
  if (r) {
    const char* s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    state = s ? s : "";
    msg = trimmed(PQresultErrorMessage(r));
  }
  if (msg.empty()) msg = trimmed(PQerrorMessage(conn_));
  throw PgError("PostgreSQL (" + where_ + ") failed (" + sql.substr(0, 120) + "): " + msg +
                    (state.empty() ? "" : " [SQLSTATE " + state + "]"),
                state);
}

PgResult PgConn::exec(const std::string& sql) {
  ensure_connected();
  return check(PQexec(conn_, sql.c_str()), sql);
}

PgResult PgConn::exec(const std::string& sql, const PgParams& params) {
  ensure_connected();
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& v : params.values()) values.push_back(v ? v->c_str() : nullptr);
  return check(PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr,
                            values.data(), nullptr, nullptr, 0),
               sql);
}

std::vector<int> PgConn::take_notifications() {
  std::vector<int> pids;
  if (PQstatus(conn_) != CONNECTION_OK) return pids;
  // A failed read means the connection broke; the next statement reconnects and reports it.
  if (PQconsumeInput(conn_) == 0) return pids;
  while (PGnotify* n = PQnotifies(conn_)) {
    pids.push_back(n->be_pid);
    PQfreemem(n);
  }
  return pids;
}

PgTransaction::PgTransaction(PgConn& c, const char* begin_sql) : c_(c) { c_.exec(begin_sql); }

PgTransaction::~PgTransaction() {
  if (!open_) return;
  // Destructors must not throw; a connection that cannot roll back is reset by the next call.
  PGresult* r = PQexec(c_.get(), "ROLLBACK");
  PQclear(r);
}

void PgTransaction::commit() {
  c_.exec("COMMIT");
  open_ = false;
}

std::string pg_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = s[i] == '\0' ? 0 : utf8_len_at(s, i);
    if (len == 0) {
      append_replacement(out);
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

std::optional<std::string> pg_text_problem(std::string_view s) {
  if (s.find('\0') != std::string_view::npos)
    return "contains a NUL byte, which PostgreSQL text cannot hold";
  if (!is_valid_utf8(s)) return "is not valid UTF-8";
  return std::nullopt;
}

}  // namespace moebatch
