// Helpers shared by the service tests: the demo model, the daemon's ready file, a blocking HTTP
// GET. Temp dirs, child processes, waits and plain SQL are the shared harness's (tests/common).
#pragma once

#include <sqlite3.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "service/demo_model.h"
#include "tests/common/files.h"
#include "tests/common/wait.h"

namespace moebatch::test {

/// The demo model (random weights, vocab of the bundled tokenizer), generated once per build.
inline std::filesystem::path demo_model() {
  return ensure_demo_model(MOEBATCH_TEST_CACHE,
                           std::filesystem::path(test_data_dir()) / "qwen3-tokenizer");
}

/// The daemon's ready file (JSON: ports, worker name) once it appears complete; nullopt when it
/// does not within `timeout`.
inline std::optional<nlohmann::json> wait_ready(const std::filesystem::path& file,
                                                std::chrono::milliseconds timeout) {
  std::optional<nlohmann::json> ready;
  wait_until(
      [&] {
        auto j = nlohmann::json::parse(read_file(file), nullptr, false);
        if (j.is_discarded()) return false;
        ready = std::move(j);
        return true;
      },
      timeout);
  return ready;
}

/// Blocking HTTP/1.1 GET on 127.0.0.1:port; returns (status, body), status -1 on failure.
inline std::pair<int, std::string> http_get(int port, const std::string& target) {
  namespace net = boost::asio;
  try {
    net::io_context io;
    net::ip::tcp::socket s(io);
    s.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
    const std::string req =
        "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
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

/// A whole HTTP response as the tests look at it.
struct HttpResult {
  int status = -1;                             ///< -1: no response (refused, closed, timed out)
  std::map<std::string, std::string> headers;  ///< lower-case names
  std::string body;                            ///< de-chunked body
};

/// One HTTP/1.1 connection to 127.0.0.1:port (Beast client), for several requests in a row.
class HttpClient {
 public:
  explicit HttpClient(int port) : socket_(io_) {
    socket_.connect(
        {boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  }
  /// Sends a request and reads the whole response; status -1 when the server closed instead.
  HttpResult request(const std::string& method, const std::string& target,
                     const std::string& body = "",
                     const std::vector<std::pair<std::string, std::string>>& headers = {},
                     bool keep_alive = true) {
    namespace http = boost::beast::http;
    HttpResult out;
    try {
      http::request<http::string_body> req{http::string_to_verb(method), target, 11};
      req.set(http::field::host, "localhost");
      for (const auto& [k, v] : headers) req.set(k, v);
      req.keep_alive(keep_alive);
      req.body() = body;
      if (!body.empty() || method == "POST") req.prepare_payload();
      http::write(socket_, req);
      http::response_parser<http::string_body> parser;
      parser.body_limit(64 << 20);
      parser.skip(method == "HEAD");  // a HEAD response announces a body it does not send
      http::read(socket_, buffer_, parser);
      const auto& res = parser.get();
      out.status = static_cast<int>(res.result_int());
      for (const auto& f : res) {
        std::string name(f.name_string().data(), f.name_string().size());
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        out.headers[name] = std::string(f.value().data(), f.value().size());
      }
      out.body = res.body();
    } catch (const std::exception&) {
      out.status = -1;
    }
    return out;
  }
  /// The raw socket (for clients that misbehave on purpose).
  boost::asio::ip::tcp::socket& socket() { return socket_; }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
};

/// One request on a fresh connection; status -1 when nothing came back.
inline HttpResult http_request(
    int port, const std::string& method, const std::string& target, const std::string& body = "",
    const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  try {
    HttpClient c(port);
    return c.request(method, target, body, headers, /*keep_alive=*/false);
  } catch (const std::exception&) {
    return {};
  }
}

/// The first column of the first row of a query as text; "" when there is no row or it is NULL.
inline std::string query_text(const std::filesystem::path& db, const std::string& sql) {
  sqlite3* h = nullptr;
  std::string out;
  if (sqlite3_open(db.c_str(), &h) == SQLITE_OK) {
    sqlite3_busy_timeout(h, 5000);
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr)
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return out;
}

/// The value of a Prometheus sample line `name value` in `metrics`, or -1 when absent.
inline double metric_value(const std::string& metrics, const std::string& name) {
  const auto p = metrics.find("\n" + name + " ");
  if (p == std::string::npos) return -1;
  return std::stod(metrics.substr(p + name.size() + 2));
}

}  // namespace moebatch::test
