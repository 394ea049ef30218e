// Helpers shared by the service tests: temporary directories, the demo model, real child
// processes, a blocking HTTP GET, and plain-SQL access to the job database.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "service/demo_model.h"

namespace moebatch::test {

/// A fresh temporary directory, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "mb-svc-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// The demo model (random weights, vocab of the bundled tokenizer), generated once per build.
inline std::filesystem::path demo_model() {
  return ensure_demo_model(MOEBATCH_TEST_CACHE,
                           std::filesystem::path(MOEBATCH_TEST_DATA) / "qwen3-tokenizer");
}

/// A child process with stdout+stderr in a log file.
struct Child {
  pid_t pid = -1;
  std::filesystem::path log;

  static Child spawn(const std::vector<std::string>& args, const std::filesystem::path& log) {
    Child c;
    c.log = log;
    c.pid = fork();
    if (c.pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return c;
  }
  /// Exit code, or 128 + signal; nullopt when still running after `timeout`.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int status = 0;
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() > end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  void signal(int sig) const {
    if (pid > 0) kill(pid, sig);
  }
  std::string read_log() const {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

/// Runs a command to completion; returns its exit code and output.
inline std::pair<int, std::string> run_command(const std::vector<std::string>& args,
                                               const std::filesystem::path& log) {
  Child c = Child::spawn(args, log);
  const auto code = c.wait_for(std::chrono::seconds(60));
  return {code.value_or(-1), c.read_log()};
}

/// Waits for a ready file (JSON) to appear.
inline std::optional<nlohmann::json> wait_ready(const std::filesystem::path& file,
                                                std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (std::filesystem::exists(file)) {
      std::ifstream in(file);
      auto j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded()) return j;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

/// Blocking HTTP/1.1 GET on 127.0.0.1:port; returns (status, body), status -1 on failure.
inline std::pair<int, std::string> http_get(int port, const std::string& target) {
  namespace net = boost::asio;
  try {
    net::io_context io;
    net::ip::tcp::socket s(io);
    s.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
    const std::string req = "GET " + target + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    net::write(s, net::buffer(req));
    std::string resp;
    boost::system::error_code ec;
    char buf[4096];
    while (true) {
      const size_t n = s.read_some(net::buffer(buf), ec);
      resp.append(buf, n);
      if (ec) break;
    }
    const int status = std::stoi(resp.substr(9, 3));
    const auto body = resp.find("\r\n\r\n");
    return {status, body == std::string::npos ? "" : resp.substr(body + 4)};
  } catch (const std::exception&) {
    return {-1, ""};
  }
}

/// Runs SQL on the database file (busy timeout 5 s); throws on error.
inline void exec_sql(const std::filesystem::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open(db_path.c_str(), &db);
  sqlite3_busy_timeout(db, 5000);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  const std::string msg = err ? err : "";
  sqlite3_free(err);
  sqlite3_close(db);
  if (rc != SQLITE_OK) throw std::runtime_error("sql failed: " + msg + ": " + sql);
}

/// A single integer from a query.
inline int64_t query_i64(const std::filesystem::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open(db_path.c_str(), &db);
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt* st = nullptr;
  int64_t v = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

}  // namespace moebatch::test
