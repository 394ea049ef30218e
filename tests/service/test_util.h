// Helpers shared by the service tests: the demo model, the daemon's ready file, a blocking HTTP
// GET. Temp dirs, child processes, waits and plain SQL are the shared harness's (tests/common).
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

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

}  // namespace moebatch::test
