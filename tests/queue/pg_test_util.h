// The tests' PostgreSQL: a private server started by tests/queue/pg_test_server.sh (by ctest's
// fixture pg_test_server_start, or here on first use when a test binary runs alone), one fresh
// database per test, and parameterization of store tests over both implementations.
// Needs MOEBATCH_PG_TEST_DIR (the script's state directory) and MOEBATCH_PG_TEST_SCRIPT.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "queue/pg_conn.h"
#include "queue/store_url.h"
#include "tests/common/files.h"
#include "tests/common/sqlite.h"

namespace moebatch::test {

/// How to reach the test server.
struct PgTestServer {
  std::string host;  ///< socket directory
  std::string port;
  std::string user;
  /// postgresql:// URL of database `db` on the server.
  std::string url(const std::string& db) const {
    return "postgresql://" + user + "@/" + db + "?host=" + host + "&port=" + port;
  }
};

/// The server, started when its state file is missing. Throws when it cannot be started.
inline const PgTestServer& pg_test_server() {
  static const PgTestServer server = [] {
    const std::filesystem::path state = MOEBATCH_PG_TEST_DIR;
    if (!std::filesystem::exists(state / "env")) {
      const std::string cmd =
          std::string("bash '") + MOEBATCH_PG_TEST_SCRIPT + "' start '" + state.string() + "' >&2";
      if (std::system(cmd.c_str()) != 0)
        throw std::runtime_error("cannot start the test PostgreSQL server: " + cmd);
    }
    std::map<std::string, std::string> env;
    std::ifstream in(state / "env");
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    PgTestServer s{env["MB_PG_HOST"], env["MB_PG_PORT"], env["MB_PG_USER"]};
    if (s.host.empty() || s.port.empty() || s.user.empty())
      throw std::runtime_error("incomplete " + (state / "env").string());
    return s;
  }();
  return server;
}

/// A fresh, empty database on the test server, dropped (connections and all) on destruction.
class PgTestDatabase {
 public:
  PgTestDatabase() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    name_ = "t" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" +
            std::to_string(rd() % 1000000);
    PgConn admin(pg_test_server().url("postgres"));
    admin.exec("CREATE DATABASE " + name_);
  }
  ~PgTestDatabase() {
    try {
      PgConn admin(pg_test_server().url("postgres"));
      admin.exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "dropping test database " << name_ << ": " << e.what();
    }
  }
  PgTestDatabase(const PgTestDatabase&) = delete;
  PgTestDatabase& operator=(const PgTestDatabase&) = delete;

  /// postgresql:// URL of the database.
  std::string url() const { return pg_test_server().url(name_); }
  /// The database's name.
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

/// Plain SQL on a PostgreSQL database from the side, as an external producer has it.
class PgSqlConnection {
 public:
  explicit PgSqlConnection(const std::string& url) : conn_(url) {}
  /// Runs sql (one or more statements); the server's error message, empty on success.
  std::string exec(const std::string& sql) {
    try {
      conn_.exec(sql);
      return "";
    } catch (const PgError& e) {
      return e.what();
    }
  }
  /// The first column of the first row as an integer; -1 when there is none or it fails.
  int64_t query_i64(const std::string& sql) {
    try {
      PgResult r = conn_.exec(sql);
      if (r.rows() == 0 || r.is_null(0, 0)) return -1;
      return r.i64(0, 0);
    } catch (const Error&) {
      return -1;
    }
  }

 private:
  PgConn conn_;
};

/// Plain SQL on the database at a --db location, whichever kind it is.
class SideConnection {
 public:
  explicit SideConnection(const std::string& location) {
    if (parse_store_location(location).kind == StoreKind::Postgres) {
      pg_ = std::make_unique<PgSqlConnection>(location);
    } else {
      sqlite_ = std::make_unique<SqlConnection>(location);
    }
  }
  /// Runs sql; the database's error message, empty on success.
  std::string exec(const std::string& sql) { return pg_ ? pg_->exec(sql) : sqlite_->exec(sql); }
  /// A single integer; -1 when there is none.
  int64_t query_i64(const std::string& sql) {
    return pg_ ? pg_->query_i64(sql) : sqlite_->query_i64(sql);
  }

 private:
  std::unique_ptr<PgSqlConnection> pg_;
  std::unique_ptr<SqlConnection> sqlite_;
};

/// Test name suffix of a store kind: "sqlite" or "postgres".
inline std::string store_kind_name(const ::testing::TestParamInfo<StoreKind>& info) {
  return info.param == StoreKind::Sqlite ? "sqlite" : "postgres";
}

/// Base of store tests that run against both implementations: location() is a fresh SQLite
/// file in a temporary directory, or a fresh PostgreSQL database.
class StoreKindTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  /// The store's --db value; the same for every call within a test.
  const std::string& location() {
    if (location_.empty()) {
      if (GetParam() == StoreKind::Postgres) {
        pg_ = std::make_unique<PgTestDatabase>();
        location_ = pg_->url();
      } else {
        location_ = (dir_.path() / "jobs.db").string();
      }
    }
    return location_;
  }
  /// A scratch directory (files other than the database).
  const std::filesystem::path& scratch() const { return dir_.path(); }
  bool postgres() const { return GetParam() == StoreKind::Postgres; }

 private:
  TempDir dir_;
  std::unique_ptr<PgTestDatabase> pg_;
  std::string location_;
};

}  // namespace moebatch::test

/// Runs the TEST_Ps of `suite` (a StoreKindTest) on SQLite and on PostgreSQL.
#define MB_INSTANTIATE_STORE_TESTS(suite)                                                \
  INSTANTIATE_TEST_SUITE_P(                                                              \
      Stores, suite,                                                                     \
      ::testing::Values(::moebatch::StoreKind::Sqlite, ::moebatch::StoreKind::Postgres), \
      ::moebatch::test::store_kind_name)
