// Helpers shared by the service tests: the demo model, the small service the tests run on it (as
// a ServiceConfig or as flags), a Service on a thread, the daemon's ready file, a blocking HTTP
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
#include <thread>
#include <utility>
#include <vector>

#include "service/config.h"
#include "service/demo_model.h"
#include "service/service.h"
#include "tests/common/files.h"
#include "tests/common/sanitizers.h"
#include "tests/common/wait.h"

namespace moebatch::test {

/// Skips the test in a ThreadSanitizer build only, saying `why`. For tests that check what the
/// service gets done within a time budget: the demo engine generates 5-17 tokens/s under TSan
/// (thousands in the plain build), so they fail there on the budget, not on a race. They still
/// run in the plain and ASan + UBSan builds; the rest of their binary still runs under TSan
/// (docs/reliability.md, "Sanitizers").
#define MB_SKIP_UNDER_TSAN(why) \
  if (::moebatch::test::kThreadSanitizer) GTEST_SKIP() << "too slow under TSan: " << (why)

/// How many times longer a deadline for work to finish is in a ThreadSanitizer build
/// (under_tsan). TSan slows the service's threads several times over and the demo engine's
/// generation far more (5-17 tokens/s, thousands in the plain build).
inline constexpr int kTsanTimeScale = 10;

/// `d` in the plain and ASan + UBSan builds, `d` * kTsanTimeScale in a ThreadSanitizer build.
/// For a wait that is a deadline for work to finish (a daemon's start, a queue drained), not a
/// latency the test is about: sized for the plain build, such a deadline fails under TSan on
/// time, not on a race. Where the bound is the point of the test, scale it only with a comment
/// on why the scaled bound still tells the intended behaviour from its failure. ctest's 300 s
/// per-test limit (tests/CMakeLists.txt) still bounds the whole test: a test that cannot fit it
/// under TSan skips there instead (MB_SKIP_UNDER_TSAN).
template <class Rep, class Period>
constexpr std::chrono::duration<Rep, Period> under_tsan(std::chrono::duration<Rep, Period> d) {
  return kThreadSanitizer ? d * kTsanTimeScale : d;
}

/// The demo model (random weights, vocab of the bundled tokenizer), generated once per build.
inline std::filesystem::path demo_model() {
  return ensure_demo_model(MOEBATCH_TEST_CACHE,
                           std::filesystem::path(test_data_dir()) / "qwen3-tokenizer");
}

/// A service on the demo model with its queue in `dir`/jobs.db: 16 MiB of KV cache, HTTP on any
/// free port, 10 ms polls, two threads. The caller sets the batch shape and warm-up.
inline ServiceConfig demo_service_config(const std::filesystem::path& dir) {
  ServiceConfig c;
  c.db = (dir / "jobs.db").string();
  c.model = demo_model().string();
  c.kv_cache_mb = 16;
  c.http_port = 0;
  c.poll_ms = 10;
  c.threads = 2;
  return c;
}

/// A Service running on its own thread for the scope of a test, without signal handling (the
/// test process keeps its signals).
struct RunningService {
  Service svc;
  int code = -1;  ///< run()'s exit code, once stopped
  std::thread t;
  explicit RunningService(const ServiceConfig& c, ServiceHooks h = {})
      : svc(c, (h.handle_signals = false, h)) {
    t = std::thread([this] { code = svc.run(); });
  }
  /// Stops the service, waits for run() to return and gives its exit code.
  int stop() {
    svc.stop();
    if (t.joinable()) t.join();
    return code;
  }
  ~RunningService() { stop(); }
  int port() const { return svc.http_port(); }
};

/// Flags of `moebatch serve` (and service_daemon): the demo model, served as "demo" with the
/// bundled tokenizer.
inline std::vector<std::string> demo_model_flags() {
  return {"--model",
          demo_model().string(),
          "--tokenizer",
          test_data_dir() + "/qwen3-tokenizer",
          "--served-model-name",
          "demo"};
}

/// Flags of `moebatch serve` (and service_daemon): a small CPU engine of `max_num_seqs` slots,
/// 256 tokens a step, 16 MiB of KV cache, one warm-up sequence, two threads.
inline std::vector<std::string> small_engine_flags(int max_num_seqs) {
  return {"--max-num-seqs",
          std::to_string(max_num_seqs),
          "--max-num-batched-tokens",
          "256",
          "--kv-cache-mb",
          "16",
          "--warmup-seqs",
          "1",
          "--threads",
          "2"};
}

/// The ready line a daemon prints on stdout ({"http_port": ..., "pub", "router"}) in `log`, the
/// child's output so far; nullopt until it is there.
inline std::optional<nlohmann::json> ready_line(const std::string& log) {
  const auto p = log.find("{\"http_port\"");
  if (p == std::string::npos) return std::nullopt;
  return nlohmann::json::parse(log.substr(p, log.find('\n', p) - p));
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
