// The HTTP server's framing as a client on the network sends it: one input is the bytes of one
// connection (request lines, headers, bodies, chunked encoding, pipelined requests, garbage),
// written to a real HttpServer on loopback, then the write side shut. Properties:
//   - the server ends the connection within a bound (no hang on any framing: a partial request
//     followed by end of stream must close, not wait for a timeout);
//   - whatever it sends is HTTP/1.1 responses (the first bytes are a status line);
//   - the server answers a well-formed request on a new connection afterwards (one input never
//     takes it down or wedges its io thread).
// Routes like the service's: a plain reply, a path parameter, an authenticated echo with a body
// limit, an event stream finished from a later io turn, a body written piece by piece.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "service/http_server.h"

namespace {

namespace net = boost::asio;
using Clock = std::chrono::steady_clock;

constexpr auto kCloseBound = std::chrono::seconds(8);  // the server's own timeouts are 3 s

struct Server {
  net::io_context io;
  net::executor_work_guard<net::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<moebatch::HttpServer> server;
  std::thread thread;

  static void write_piece(const std::weak_ptr<moebatch::HttpExchange>& weak, int i, int n) {
    const auto ex = weak.lock();
    if (!ex || ex->done()) return;
    if (i == n) return ex->end_stream();
    ex->write(std::string(1024, static_cast<char>('a' + i)));
    ex->when_drained([weak, i, n] { write_piece(weak, i + 1, n); });
  }

  Server() {
    moebatch::HttpLimits limits;
    limits.read_timeout = std::chrono::seconds(3);
    limits.idle_timeout = std::chrono::seconds(3);
    limits.write_timeout = std::chrono::seconds(3);
    server = std::make_unique<moebatch::HttpServer>(io, "127.0.0.1", 0, limits);
    server->set_api_keys({"key-1"});
    server->route({"GET", "/open", 0, false, [](const auto& ex) { ex->reply({200, "text/plain", "open\n"}); }});
    server->route({"GET", "/items/*", 0, false, [](const auto& ex) {
                     ex->reply({200, "text/plain", "item " + ex->request().params.at(0)});
                   }});
    server->route({"POST", "/echo", 1024, true, [](const auto& ex) {
                     ex->reply({200, "application/octet-stream", ex->request().body});
                   }});
    server->route({"GET", "/stream", 0, false, [this](const auto& ex) {
                     ex->begin_stream(200, "text/event-stream");
                     ex->write("data: one\n\n");
                     net::post(io, [ex] {
                       ex->write("data: two\n\n");
                       ex->end_stream();
                     });
                   }});
    server->route({"GET", "/body/*", 0, false, [](const auto& ex) {
                     const std::string& arg = ex->request().params.at(0);
                     const int n = arg.size() == 1 && arg[0] >= '0' && arg[0] <= '8' ? arg[0] - '0' : 1;
                     ex->begin_body(200, "application/octet-stream", n * 1024);
                     write_piece(ex, 0, n);
                   }});
    server->start();
    thread = std::thread([this] { io.run(); });
  }
};

Server& server() {
  static Server* s = new Server();  // lives for the process: libFuzzer exits without unwinding
  return *s;
}

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) __builtin_trap();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{1, 0};  // each recv; the whole exchange is bounded by kCloseBound
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  // The client shuts its side first, so each connection leaves a TIME_WAIT entry for 60 s on
  // its source port: at ~1,000 connections a second one source address runs out of ports. The
  // whole of 127/8 is loopback, so the source address turns over 250 of them.
  static unsigned next_source = 0;
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + next_source++ % 250);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof source) != 0) {
    std::fprintf(stderr, "fuzz_http: bind: %s\n", std::strerror(errno));
    __builtin_trap();
  }
  int err = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
  if (err == EINTR) {  // libFuzzer's timer signal: the connection goes on; wait for it
    pollfd pfd{fd, POLLOUT, 0};
    socklen_t len = sizeof err;
    err = ::poll(&pfd, 1, 2000) == 1 ? (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), err) : ETIMEDOUT;
  }
  if (err != 0) {
    std::fprintf(stderr, "fuzz_http: connect: %s\n", std::strerror(err));  // the server stopped accepting
    __builtin_trap();
  }
  return fd;
}

// Sends `bytes`, shuts the write side and reads until the server closes; traps past the bound.
std::string exchange(int port, const uint8_t* data, size_t size) {
  const int fd = connect_loopback(port);
  // The server may answer and close before taking every byte (a refused header): a failed send
  // is not a finding, what it answered is still read.
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string got;
  const auto start = Clock::now();
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;                                // closed by the server
    if (n < 0 && errno == ECONNRESET) break;          // closed with bytes of ours unread
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    if (Clock::now() - start > kCloseBound) __builtin_trap();  // the connection hangs
  }
  ::close(fd);
  return got;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Server& s = server();
  const std::string got = exchange(s.server->port(), data, size);
  if (!got.empty() && got.rfind("HTTP/1.1 ", 0) != 0) __builtin_trap();  // not a response
  static const std::string kProbe = "GET /open HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string probe = exchange(s.server->port(), reinterpret_cast<const uint8_t*>(kProbe.data()), kProbe.size());
  if (probe.rfind("HTTP/1.1 200", 0) != 0 || probe.find("\r\n\r\nopen\n") == std::string::npos)
    __builtin_trap();  // the server stopped answering
  return 0;
}
