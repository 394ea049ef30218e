// The HTTP server alone, on its own io_context thread with test routes: routing, keep-alive,
// body limits (413 before the body is read), bearer keys, the connection cap, 100-continue,
// deferred and streamed replies, the disconnect callback of a pending exchange, request paths
// that are not UTF-8, and closing connections that end after a deferred reply.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <future>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <thread>

#include "service/http_server.h"
#include "tests/common/wait.h"
#include "tests/service/test_util.h"

namespace moebatch {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;

/// A server with test routes on its own thread.
struct TestServer {
  net::io_context io;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  std::shared_ptr<HttpExchange> parked;  // io thread only
  std::atomic<int> disconnects{0};
  std::atomic<int> pieces_written{0};  // by /body/*

  // /body/N: N pieces of kPiece bytes under one Content-Length, each written once the last has
  // left (as a file download is); /body/cutN: N pieces, then abort.
  static constexpr size_t kPiece = 256 << 10;
  static std::string piece(int i) { return std::string(kPiece, static_cast<char>('a' + i % 26)); }
  void write_piece(const std::weak_ptr<HttpExchange>& weak, int i, int n, bool cut) {
    const auto ex = weak.lock();
    if (!ex || ex->done()) return;
    if (i == n) {
      if (cut) {
        ex->abort();
      } else {
        ex->end_stream();
      }
      return;
    }
    ex->write(piece(i));
    ++pieces_written;
    ex->when_drained([this, weak, i, n, cut] { write_piece(weak, i + 1, n, cut); });
  }

  explicit TestServer(HttpLimits limits = {}, std::vector<std::string> keys = {},
                      const std::string& host = "127.0.0.1") {
    server = std::make_unique<HttpServer>(io, host, 0, limits);
    server->set_api_keys(std::move(keys));
    server->route({"GET", "/open", 0, false, [](const auto& ex) {
                     ex->reply({200, "text/plain", "open\n"});
                   }});
    server->route({"GET", "/items/*", 0, true, [](const auto& ex) {
                     ex->reply({200, "text/plain", "item " + ex->request().params.at(0)});
                   }});
    server->route({"POST", "/echo", 1024, true, [](const auto& ex) {
                     ex->reply({200, "text/plain", ex->request().body});
                   }});
    server->route({"POST", "/park", 1024, false, [this](const auto& ex) {
                     parked = ex;
                     ex->on_disconnect([this] { ++disconnects; });
                   }});
    server->route({"GET", "/stream", 0, false, [this](const auto& ex) {
                     ex->begin_stream(200, "text/event-stream");
                     ex->write("data: one\n\n");
                     // The rest comes from the io thread later, as engine progress does.
                     net::post(io, [ex] {
                       ex->write("data: two\n\n");
                       ex->end_stream();
                     });
                   }});
    server->route({"GET", "/body/*", 0, false, [this](const auto& ex) {
                     std::string arg = ex->request().params.at(0);
                     const bool cut = arg.rfind("cut", 0) == 0;
                     const int n = std::stoi(cut ? arg.substr(3) : arg);
                     // A cut body promises one piece more than it sends.
                     ex->begin_body(200, "application/octet-stream", (n + (cut ? 1 : 0)) * kPiece);
                     if (ex->request().head) {
                       ex->end_stream();
                       return;
                     }
                     write_piece(ex, 0, n, cut);
                   }});
    // A handler that fails once its body has started: in the handler itself, or in the
    // callback that writes its next piece. The connection is cut; the server lives on.
    server->route({"GET", "/broken/*", 0, false, [](const auto& ex) {
                     ex->begin_body(200, "application/octet-stream", 2 * kPiece);
                     if (ex->request().params.at(0) == "handler") throw std::runtime_error("bug");
                     ex->write(piece(0));
                     ex->when_drained([] { throw std::runtime_error("bug in the next piece"); });
                   }});
    server->start();
    work.emplace(io.get_executor());
    thread = std::thread([this] { io.run(); });
  }
  ~TestServer() {
    net::post(io, [this] {
      server->stop();
      parked.reset();
      work.reset();
      io.stop();
    });
    thread.join();
  }
  int port() const { return server->port(); }
  /// Runs f on the io thread and waits for it.
  void on_io(std::function<void()> f) {
    std::promise<void> done;
    net::post(io, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
  /// Whether /park holds an exchange now (read on the io thread).
  bool has_parked() {
    bool have = false;
    on_io([&] { have = parked != nullptr; });
    return have;
  }
};

/// Raw bytes to the server; everything it sends back until it closes or `ms` pass.
std::string raw_exchange(int port, const std::string& bytes, int ms = 2000) {
  net::io_context io;
  net::ip::tcp::socket s(io);
  s.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  net::write(s, net::buffer(bytes));
  std::string out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  s.non_blocking(true);
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    boost::system::error_code ec;
    const size_t n = s.read_some(net::buffer(buf), ec);
    if (ec == net::error::would_block) {
      std::this_thread::sleep_for(5ms);
      continue;
    }
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

/// The first response in raw bytes: its status line and body (by Content-Length); the rest of
/// `raw` is left in `rest`.
struct RawResponse {
  std::string status_line, body, rest;
};
RawResponse first_response(const std::string& raw) {
  RawResponse out;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return out;
  out.status_line = raw.substr(0, raw.find("\r\n"));
  const std::string head = raw.substr(0, head_end);
  const size_t cl = head.find("Content-Length: ");
  const size_t length = cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 16));
  out.body = raw.substr(head_end + 4, length);
  out.rest = raw.substr(std::min(raw.size(), head_end + 4 + length));
  return out;
}

TEST(HttpServer, RoutesKeepAliveAndOpenAiShapedErrors) {
  TestServer ts;
  test::HttpClient c(ts.port());
  for (int i = 0; i < 3; ++i) {  // one connection, several requests
    auto r = c.request("GET", "/open");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "open\n");
  }
  EXPECT_EQ(c.request("GET", "/items/42").body, "item 42");
  auto nf = c.request("GET", "/nope");
  EXPECT_EQ(nf.status, 404);
  const auto j = nlohmann::json::parse(nf.body);
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_TRUE(j["error"].contains("param"));
  auto na = c.request("DELETE", "/open");
  EXPECT_EQ(na.status, 405);
  EXPECT_EQ(na.headers["allow"], "GET");
  auto head = c.request("HEAD", "/open");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(c.request("GET", "/open").status, 200);  // still the same connection
  EXPECT_EQ(ts.server->counters().accepted, 1);
}

TEST(HttpServer, BodyLimitsAnswer413BeforeReadingTheBody) {
  TestServer ts;
  EXPECT_EQ(test::http_request(ts.port(), "POST", "/echo", std::string(1024, 'x')).status, 200);
  EXPECT_EQ(test::http_request(ts.port(), "POST", "/echo", std::string(1025, 'x')).status, 413);
  // Declared too large: refused on the header alone, without waiting for the body.
  const std::string r = raw_exchange(
      ts.port(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20000000\r\n\r\n", 500);
  EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
  EXPECT_NE(r.find("request_too_large"), std::string::npos) << r;
  // A chunked body that grows past the limit.
  const std::string chunked =
      raw_exchange(ts.port(),
                   "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" +
                       std::string(0x800, 'y') + "\r\n0\r\n\r\n",
                   500);
  EXPECT_EQ(chunked.rfind("HTTP/1.1 413", 0), 0u) << chunked;
  // Expect: 100-continue gets its interim answer, then the real one.
  const std::string cont =
      raw_exchange(ts.port(),
                   "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                   "Content-Length: 3\r\n\r\nabc");
  EXPECT_EQ(cont.rfind("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", 0), 0u) << cont;
  // Garbage is dropped without harming the server.
  raw_exchange(ts.port(), "\x01\x02 not http\r\n\r\n", 300);
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);
}

TEST(HttpServer, BearerKeysGuardOnlyTheRoutesThatAskForThem) {
  TestServer ts({}, {"k1", "sekret"});
  auto none = test::http_request(ts.port(), "GET", "/items/1");
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(nlohmann::json::parse(none.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(
      test::http_request(ts.port(), "GET", "/items/1", "", {{"Authorization", "Bearer sekreT"}})
          .status,
      401);
  EXPECT_EQ(
      test::http_request(ts.port(), "GET", "/items/1", "", {{"Authorization", "Basic sekret"}})
          .status,
      401);
  EXPECT_EQ(
      test::http_request(ts.port(), "GET", "/items/1", "", {{"Authorization", "Bearer sekret"}})
          .status,
      200);
  EXPECT_EQ(
      test::http_request(ts.port(), "POST", "/echo", "hi", {{"Authorization", "bearer k1"}}).body,
      "hi");
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);  // no auth asked
  EXPECT_TRUE(api_key_matches({"a", "bc"}, "bc"));
  EXPECT_FALSE(api_key_matches({"a", "bc"}, "b"));
  EXPECT_FALSE(api_key_matches({"a", "bc"}, "bcd"));
  EXPECT_FALSE(api_key_matches({"a"}, ""));
  EXPECT_FALSE(api_key_matches({}, "a"));
}

TEST(HttpServer, ConnectionCapAnswers503AndFreesUp) {
  HttpLimits limits;
  limits.max_connections = 2;
  TestServer ts(limits);
  auto a = std::make_unique<test::HttpClient>(ts.port());
  test::HttpClient b(ts.port());
  EXPECT_EQ(a->request("GET", "/open").status, 200);
  EXPECT_EQ(b.request("GET", "/open").status, 200);
  auto third = test::http_request(ts.port(), "GET", "/open");
  EXPECT_EQ(third.status, 503);
  EXPECT_NE(third.body.find("too_many_connections"), std::string::npos);
  a.reset();  // one closes: room again
  EXPECT_TRUE(test::wait_until(
      [&] { return test::http_request(ts.port(), "GET", "/open").status == 200; }, 5s));
  EXPECT_GE(ts.server->counters().rejected, 1);
}

// This machine's first IPv4 address other than loopback, empty when it has none.
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
  }
  freeifaddrs(list);
  return found;
}

// One address other than loopback holds at most max_connections_per_address; the next
// connection from it gets 503 while loopback clients are still served, and a closed one makes
// room.
TEST(HttpServer, OneAddressCannotHoldEveryConnection) {
  const std::string ip = non_loopback_ipv4();
  if (ip.empty()) GTEST_SKIP() << "no IPv4 address other than loopback here";
  HttpLimits limits;
  limits.max_connections = 10;
  limits.max_connections_per_address = 2;
  TestServer ts(limits, {}, "0.0.0.0");
  net::io_context io;
  const auto connect = [&] {
    auto s = std::make_unique<net::ip::tcp::socket>(io);
    s->connect({net::ip::make_address(ip), static_cast<unsigned short>(ts.port())});
    return s;
  };
  // A request and its whole reply on a connection that stays open (or is closed by the server).
  const auto ask = [](net::ip::tcp::socket& s) {
    const std::string req = "GET /open HTTP/1.1\r\nHost: x\r\n\r\n";
    net::write(s, net::buffer(req));
    std::string reply;
    boost::system::error_code ec;
    net::read_until(s, net::dynamic_buffer(reply), "\r\n\r\n", ec);
    return reply;
  };
  auto a = connect();
  auto b = connect();
  EXPECT_NE(ask(*a).find("200 OK"), std::string::npos);
  EXPECT_NE(ask(*b).find("200 OK"), std::string::npos);
  auto c = connect();
  std::string refused;
  boost::system::error_code ec;
  net::read(*c, net::dynamic_buffer(refused), ec);  // the 503, then the server's close
  EXPECT_NE(refused.find("503"), std::string::npos) << refused;
  EXPECT_NE(refused.find("from this address"), std::string::npos) << refused;
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);  // loopback: not capped
  a.reset();
  EXPECT_TRUE(test::wait_until(
      [&] { return ask(*connect()).find("200 OK") != std::string::npos; }, 5s));
  size_t rejected = 0;
  ts.on_io([&] { rejected = static_cast<size_t>(ts.server->counters().rejected_per_address); });
  EXPECT_GE(rejected, 1u);
}

TEST(HttpServer, StreamsAndNoticesAClientThatLeavesAPendingExchange) {
  TestServer ts;
  auto s = test::http_request(ts.port(), "GET", "/stream");
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.headers["content-type"], "text/event-stream");
  EXPECT_EQ(s.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(s.body, "data: one\n\ndata: two\n\n");

  // A parked exchange is answered later from the io thread.
  std::thread later([&] {
    test::wait_until([&] { return ts.has_parked(); }, 5s);
    ts.on_io([&] { ts.parked->reply({201, "text/plain", "later"}); });
  });
  auto p = test::http_request(ts.port(), "POST", "/park", "x");
  later.join();
  EXPECT_EQ(p.status, 201);
  EXPECT_EQ(p.body, "later");
  EXPECT_EQ(ts.disconnects.load(), 0);

  // A client that closes while its exchange is pending: the callback runs, once.
  ts.on_io([&] { ts.parked.reset(); });
  {
    test::HttpClient c(ts.port());
    const std::string req = "POST /park HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx";
    net::write(c.socket(), net::buffer(req));
    EXPECT_TRUE(test::wait_until([&] { return ts.has_parked(); }, 5s));
  }
  EXPECT_TRUE(test::wait_until([&] { return ts.disconnects.load() == 1; }, 5s));
  bool done = false;
  ts.on_io([&] {
    done = ts.parked->done();
    ts.parked->reply({200, "text/plain", "too late"});  // ignored
  });
  EXPECT_TRUE(done);
  EXPECT_EQ(ts.disconnects.load(), 1);
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);
}

// Beast lets bytes 0x80-0xFF through in a request target, and the 404/405 messages quote the
// path: the reply is still valid JSON (U+FFFD for the bad byte), and the server goes on serving,
// on that connection and others.
TEST(HttpServer, PathsThatAreNotUtf8GetJsonErrorsAndTheServerLivesOn) {
  TestServer ts;
  const std::string raw =
      raw_exchange(ts.port(),
                   "GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n"
                   "DELETE /items/\xff HTTP/1.1\r\nHost: x\r\n\r\n"
                   "GET /open HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const RawResponse nf = first_response(raw);
  EXPECT_EQ(nf.status_line, "HTTP/1.1 404 Not Found") << raw;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(nf.body)) << nf.body;  // parse checks UTF-8
  EXPECT_EQ(j["error"]["message"], "no route for GET /\xEF\xBF\xBD");
  EXPECT_EQ(j["error"]["code"], "not_found");
  const RawResponse na = first_response(nf.rest);
  EXPECT_EQ(na.status_line, "HTTP/1.1 405 Method Not Allowed") << raw;
  ASSERT_NO_THROW(j = nlohmann::json::parse(na.body)) << na.body;
  EXPECT_EQ(j["error"]["message"], "method DELETE is not allowed on /items/\xEF\xBF\xBD");
  const RawResponse ok = first_response(na.rest);
  EXPECT_EQ(ok.status_line, "HTTP/1.1 200 OK") << raw;
  EXPECT_EQ(ok.body, "open\n");
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);
}

// A deferred reply on a connection that closes after it (Connection: close, or HTTP/1.0): the
// session ends even though the client keeps its socket open, so the count of open connections
// goes back to 0 (it used to stay up until the cap refused everyone).
TEST(HttpServer, AClosingConnectionEndsAfterADeferredReplyWhileTheClientStays) {
  TestServer ts;
  const auto open_connections = [&] {
    size_t open = 0;
    ts.on_io([&] { open = ts.server->counters().open; });
    return open;
  };
  for (const std::string request :
       {"POST /park HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
        "POST /park HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"}) {
    ts.on_io([&] { ts.parked.reset(); });
    test::HttpClient c(ts.port());
    net::write(c.socket(), net::buffer(request));
    ASSERT_TRUE(test::wait_until([&] { return ts.has_parked(); }, 5s));
    ts.on_io([&] { ts.parked->reply({200, "text/plain", "later"}); });
    std::string reply;
    boost::system::error_code ec;
    net::read(c.socket(), net::dynamic_buffer(reply), ec);  // to the server's FIN
    EXPECT_EQ(ec, net::error::eof);
    EXPECT_EQ(first_response(reply).body, "later") << reply;
    // The client still holds its end open here.
    EXPECT_TRUE(test::wait_until([&] { return open_connections() == 0; }, 5s)) << request;
  }
  EXPECT_EQ(ts.disconnects.load(), 0);
}

// A body of known length written a piece at a time: Content-Length, not chunked; each piece
// queued only once the socket took the last, so a client that does not read holds the writer
// back (a download never queues the whole file); HEAD sends the header alone; the connection
// stays usable after a whole body and closes after a cut one.
TEST(HttpServer, ABodyOfKnownLengthIsWrittenAtTheReadersPace) {
  TestServer ts;
  const auto body_of = [](int n) {
    std::string b;
    for (int i = 0; i < n; ++i) b += TestServer::piece(i);
    return b;
  };
  const auto r = test::http_request(ts.port(), "GET", "/body/3");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-length"), std::to_string(3 * TestServer::kPiece));
  EXPECT_EQ(r.headers.count("transfer-encoding"), 0u);
  EXPECT_TRUE(r.body == body_of(3)) << r.body.size();

  // Kept alive: the next request on the connection is answered; HEAD gets the length only.
  const std::string two =
      "HEAD /body/5 HTTP/1.1\r\nHost: x\r\n\r\nGET /body/1 HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /open HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string raw = raw_exchange(ts.port(), two);
  const size_t head_end = raw.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << raw.substr(0, 200);
  const std::string length = "Content-Length: " + std::to_string(5 * TestServer::kPiece);
  EXPECT_NE(raw.substr(0, head_end).find(length), std::string::npos);
  const RawResponse second = first_response(raw.substr(head_end + 4));
  EXPECT_EQ(second.status_line, "HTTP/1.1 200 OK");
  EXPECT_TRUE(second.body == body_of(1)) << second.body.size();
  EXPECT_EQ(first_response(second.rest).body, "open\n");

  // A reader that waits: 64 pieces (16 MiB) do not all leave for the socket while it reads
  // nothing, and all arrive once it reads.
  ts.pieces_written = 0;
  {
    test::HttpClient c(ts.port());
    const std::string req = "GET /body/64 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    net::write(c.socket(), net::buffer(req));
    ASSERT_TRUE(test::wait_until([&] { return ts.pieces_written.load() > 0; }, 5s));
    std::this_thread::sleep_for(300ms);
    const int early = ts.pieces_written.load();
    EXPECT_LT(early, 64) << "the writer ran ahead of a reader that read nothing";
    std::string reply;
    boost::system::error_code ec;
    net::read(c.socket(), net::dynamic_buffer(reply), ec);
    EXPECT_EQ(ec, net::error::eof);
    EXPECT_EQ(ts.pieces_written.load(), 64);
    EXPECT_TRUE(first_response(reply).body == body_of(64)) << reply.size();
  }

  // Cut short: the client gets the header and what was sent, then the connection closes.
  const auto start = std::chrono::steady_clock::now();
  const std::string cut = raw_exchange(ts.port(), "GET /body/cut2 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms) << "the cut connection stayed open";
  const size_t cut_head = cut.find("\r\n\r\n");
  ASSERT_NE(cut_head, std::string::npos);
  EXPECT_EQ(cut.size() - cut_head - 4, 2 * TestServer::kPiece);
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);

  // A failure after the header: the body is cut at once (not left waiting), the server lives.
  for (const std::string where : {"handler", "drained"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string broken =
        raw_exchange(ts.port(), "GET /broken/" + where + " HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms) << where;
    // (the handler's own failure may close the socket before the header has left)
    if (where == "drained") {
      EXPECT_EQ(broken.rfind("HTTP/1.1 200 OK", 0), 0u);
    }
    EXPECT_LT(broken.size(), 2 * TestServer::kPiece) << where;
    EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200) << where;
  }
}

// A reply of known length has write_timeout + length / min_send_rate in all: a reader that takes
// each piece well inside write_timeout, but far below the floor, is cut at that deadline; one
// that keeps up gets the whole body under the same limits.
TEST(HttpServer, AReplyOfKnownLengthIsCutBelowTheMinimumSendRate) {
  HttpLimits limits;
  limits.write_timeout = 1s;
  limits.min_send_rate = 32 << 20;  // 64 MiB: 1 s + 3 s in all
  TestServer ts(limits);
  const size_t body = 256 * TestServer::kPiece;  // 64 MiB
  {
    test::HttpClient c(ts.port());
    const std::string req = "GET /body/256 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    net::write(c.socket(), net::buffer(req));
    // 32 KiB every 5 ms (~6 MiB/s, a fifth of the floor) for 5 s, then as fast as it comes. A
    // much slower reader would trip write_timeout itself: a blocked writer is woken only once a
    // good part of its socket's send buffer (MiB on loopback) is free. The kernel's buffers hold
    // some MiB, far from the 64.
    std::string got(32 << 10, '\0');
    size_t total = 0;
    boost::system::error_code ec;
    const auto t0 = std::chrono::steady_clock::now();
    while (!ec && std::chrono::steady_clock::now() - t0 < 5s) {
      total += c.socket().read_some(net::buffer(got), ec);
      std::this_thread::sleep_for(5ms);
    }
    std::string rest;
    net::read(c.socket(), net::dynamic_buffer(rest), ec);
    total += rest.size();
    EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << ec.message();
    EXPECT_LT(total, body) << "a reader far below the floor got the whole body";
    EXPECT_GT(total, 2 * TestServer::kPiece) << "cut before the deadline";
  }
  const auto r = test::http_request(ts.port(), "GET", "/body/256");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), body);
}

// The per-address cap's key: loopback free, IPv4 (plain or mapped) by address, IPv6 by /64 — a
// host picks addresses from its /64 at will, so counting each would not cap it at all.
TEST(HttpServer, ThePerAddressCapCountsAnIpv6HostByItsSlash64) {
  const auto group = [](const char* a) { return http_client_group(net::ip::make_address(a)); };
  EXPECT_EQ(group("127.0.0.1"), "");
  EXPECT_EQ(group("127.3.4.5"), "");
  EXPECT_EQ(group("::1"), "");
  EXPECT_EQ(group("::ffff:127.0.0.1"), "");
  EXPECT_EQ(group("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(group("::ffff:10.1.2.3"), "10.1.2.3");
  EXPECT_NE(group("10.1.2.3"), group("10.1.2.4"));
  EXPECT_EQ(group("2001:db8:0:7:1:2:3:4"), "2001:db8:0:7::/64");
  EXPECT_EQ(group("2001:db8:0:7:ffff::9"), "2001:db8:0:7::/64");
  EXPECT_EQ(group("2001:db8:0:8::1"), "2001:db8:0:8::/64");
  EXPECT_EQ(group("fe80::1:2"), "fe80::/64");
}

// A client may shut its sending side once the request is out and still read the answer: a
// download then arrives whole, and the connection closes after it (nothing more can come).
// A pending exchange that is not a download still counts such a client as gone.
TEST(HttpServer, AClientThatHalfClosesStillGetsItsDownload) {
  TestServer ts;
  std::string expected;
  for (int i = 0; i < 16; ++i) expected += TestServer::piece(i);
  {
    test::HttpClient c(ts.port());
    net::write(c.socket(), net::buffer(std::string("GET /body/16 HTTP/1.1\r\nHost: x\r\n\r\n")));
    c.socket().shutdown(net::ip::tcp::socket::shutdown_send);
    std::this_thread::sleep_for(200ms);  // the server sees the end of input before any read
    std::string reply;
    boost::system::error_code ec;
    net::read(c.socket(), net::dynamic_buffer(reply), ec);
    EXPECT_EQ(ec, net::error::eof) << "the connection was reset, not closed";
    const RawResponse r = first_response(reply);
    EXPECT_EQ(r.status_line, "HTTP/1.1 200 OK");
    EXPECT_TRUE(r.body == expected) << r.body.size() << " of " << expected.size();
    EXPECT_TRUE(r.rest.empty());
  }
  {
    const int before = ts.disconnects.load();
    test::HttpClient c(ts.port());
    net::write(c.socket(),
               net::buffer(std::string("POST /park HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")));
    ASSERT_TRUE(test::wait_until([&] { return ts.has_parked(); }, 5s));
    c.socket().shutdown(net::ip::tcp::socket::shutdown_send);
    EXPECT_TRUE(test::wait_until([&] { return ts.disconnects.load() > before; }, 5s));
  }
  EXPECT_EQ(test::http_request(ts.port(), "GET", "/open").status, 200);
}

}  // namespace
}  // namespace moebatch
