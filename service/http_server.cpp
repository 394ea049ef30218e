#include "service/http_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "common/error.h"
#include "common/json_parse.h"

namespace moebatch {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

/// What the listener and every session share (sessions may outlive the server by a moment).
struct HttpServer::State {
  std::vector<HttpRoute> routes;
  std::vector<std::string> api_keys;
  HttpLimits limits;
  HttpCounters counters;
  std::unordered_map<std::string, size_t> per_address;  // open connections by remote address
  // Accept failures: whether the last accept failed, those not logged yet, and when the last
  // line about them went out (one window for failure and recovery lines alike, so a listener
  // at the edge of its descriptor limit cannot flood the log either way).
  bool accept_failing = false;
  int64_t accept_unlogged = 0;
  std::optional<std::chrono::steady_clock::time_point> accept_logged_at;
};

namespace {

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    const size_t j = std::min(path.find('/', i), path.size());
    out.push_back(path.substr(i, j - i));
    i = j;
  }
  return out;
}

// Matches `path` against a route pattern; the '*' segments go to `params`.
bool match(std::string_view pattern, std::string_view path, std::vector<std::string>& params) {
  const auto ps = split_path(pattern);
  const auto xs = split_path(path);
  if (ps.size() != xs.size()) return false;
  std::vector<std::string> got;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i] == "*") {
      got.emplace_back(xs[i]);
    } else if (ps[i] != xs[i]) {
      return false;
    }
  }
  params = std::move(got);
  return true;
}

}  // namespace

HttpReply json_error(int status, std::string_view message, std::string_view type,
                     std::string_view param, std::string_view code) {
  nlohmann::json e{{"message", message},
                   {"type", type},
                   {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                   {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  // Messages quote the request path, and Beast passes bytes 0x80-0xFF in a target through.
  return {status, "application/json", dump_json(nlohmann::json{{"error", e}}) + "\n", {}};
}

std::string HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return v;
  return {};
}

bool api_key_matches(const std::vector<std::string>& keys, std::string_view presented) {
  // No early exit: every key is compared over the presented length, so timing tells nothing
  // about how much of a key was right. Lengths differ -> mismatch, folded in the same way.
  unsigned found = 0;
  for (const std::string& key : keys) {
    volatile unsigned char diff = key.size() != presented.size() ? 1 : 0;
    for (size_t i = 0; i < presented.size(); ++i) {
      const unsigned char k = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
      diff = static_cast<unsigned char>(diff | (k ^ static_cast<unsigned char>(presented[i])));
    }
    found |= diff == 0 ? 1u : 0u;
  }
  return found != 0 && !presented.empty();
}

/// One connection: requests one after another (keep-alive); each is routed to a handler that
/// answers through an HttpExchange, at once or later.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  using Clock = std::chrono::steady_clock;

  // `address`: the remote address counted against the per-address cap, empty for loopback.
  HttpSession(tcp::socket socket, std::shared_ptr<HttpServer::State> state, std::string address)
      : stream_(std::move(socket)), state_(std::move(state)), address_(std::move(address)) {
    ++state_->counters.open;
    ++state_->counters.accepted;
    if (!address_.empty()) ++state_->per_address[address_];
  }
  ~HttpSession() {
    --state_->counters.open;
    if (!address_.empty()) {
      const auto it = state_->per_address.find(address_);
      if (it != state_->per_address.end() && --it->second == 0) state_->per_address.erase(it);
    }
  }

  void start() { do_read(/*first=*/true); }

  // At a connection cap: one 503 without reading the request, then close.
  void reject(bool per_address) {
    ++state_->counters.rejected;
    if (per_address) ++state_->counters.rejected_per_address;
    keep_alive_ = false;
    send(json_error(503,
                    per_address ? "too many open connections from this address; retry later"
                                : "too many open connections; retry later",
                    "server_error", {}, "too_many_connections"));
  }

  // ---- called by HttpExchange ----
  void send(HttpReply r) {
    res_.emplace();
    res_->version(11);
    res_->result(static_cast<http::status>(r.status));
    res_->set(http::field::server, "moebatch");
    res_->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res_->set(k, v);
    res_->keep_alive(keep_alive_);
    const size_t length = r.body.size();
    res_->body() = head_ ? std::string() : std::move(r.body);
    res_->prepare_payload();
    if (head_) res_->content_length(length);
    ++gen_;  // a pending disconnect watch belongs to the finished exchange now
    exchange_.reset();
    body_deadline_ = body_deadline(res_->body().size());  // empty for HEAD
    arm_write();
    http::async_write(stream_, *res_,
                      beast::bind_front_handler(&HttpSession::on_written, shared_from_this()));
  }

  // A chunked stream, or with `length` a body of that many bytes sent as it comes.
  void begin_stream(int status, std::string content_type, HttpHeaders headers,
                    std::optional<uint64_t> length = std::nullopt) {
    sr_.reset();
    sres_.emplace();
    sres_->version(11);
    sres_->result(static_cast<http::status>(status));
    sres_->set(http::field::server, "moebatch");
    sres_->set(http::field::content_type, content_type);
    for (auto& [k, v] : headers) sres_->set(k, v);
    sres_->keep_alive(keep_alive_);
    sized_ = length.has_value();
    left_ = length.value_or(0);
    if (sized_) {
      sres_->content_length(*length);
    } else {
      sres_->set(http::field::cache_control, "no-cache");
      sres_->chunked(true);
    }
    sr_.emplace(*sres_);
    writing_ = true;
    body_deadline_ = sized_ ? body_deadline(head_ ? 0 : *length) : Clock::time_point::max();
    arm_write();
    http::async_write_header(stream_, *sr_,
                             beast::bind_front_handler(&HttpSession::on_chunk, shared_from_this()));
  }

  // Appended in place: an event stream's deltas are a few bytes each, one a token.
  void stream_write(std::string_view data) {
    if (sized_ && head_) return;  // HEAD: the header alone
    out_.append(data.substr(0, admit(data.size())));
    if (!writing_) flush();
  }

  // Taken over when nothing waits to be written (a download's piece).
  void stream_write(std::string&& data) {
    if (sized_ && head_) return;
    data.resize(admit(data.size()));
    if (out_.empty()) {
      out_ = std::move(data);
    } else {
      out_ += data;
    }
    if (!writing_) flush();
  }

  // How many of `n` more body bytes to send. A sized body takes no more than its header
  // promised: the rest is dropped and the connection closes after it, so the client does not
  // read it as its next response.
  size_t admit(size_t n) {
    if (!sized_) return n;
    if (n > left_) {
      n = left_;
      keep_alive_ = false;
    }
    left_ -= n;
    return n;
  }

  void stream_end() {
    ending_ = true;
    if (!writing_) flush();
  }

  // The exchange's when_drained: at once (posted) when nothing waits to be written.
  void notify_when_drained() {
    if (writing_ || !out_.empty()) return;  // flush tells the exchange when the socket took it
    net::post(stream_.get_executor(), [self = shared_from_this(), gen = gen_] {
      if (gen == self->gen_ && self->exchange_) self->exchange_->drained();
    });
  }

  // The connection is closed and its exchange ends: the client went away (the watch, a failed
  // write), or HttpExchange::abort cut an unfinished reply (the exchange is already done then,
  // so its disconnect callback does not run).
  void client_gone() {
    ++gen_;
    auto ex = std::move(exchange_);
    beast::error_code ignored;
    stream_.socket().close(ignored);
    if (ex) ex->disconnected();
  }

 private:
  void do_read(bool first) {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(state_->limits.max_header_bytes));
    // No limit until the route is known: on_header checks Content-Length against the route's
    // own limit and then sets it for the body (Beast would refuse in the header read itself,
    // before we could tell which route, or answer at all).
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    head_ = false;
    // Between requests a keep-alive connection may idle a while; a request that has started
    // must arrive whole within the read timeout (checked again after the header).
    stream_.expires_after(first ? state_->limits.read_timeout : state_->limits.idle_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&HttpSession::on_header, shared_from_this()));
  }

  void on_header(beast::error_code ec, size_t) {
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      send(json_error(431, "request header fields too large", "invalid_request_error"));
      return;
    }
    if (ec) return;  // closed, timed out, malformed or aborted: nothing to answer
    ++state_->counters.requests;
    try {
      route_request();
    } catch (const std::exception& e) {
      // Whatever a client sends must not take the daemon down (an exception here would leave
      // io_context::run): this request fails alone, and the connection closes.
      spdlog::error("http {}: {}", sv(parser_->get().target()), e.what());
      keep_alive_ = false;
      refuse(json_error(500, "internal error", "server_error"));
    }
  }

  // Headers are in: route, authenticate and check the declared size before reading the body.
  void route_request() {
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    head_ = req.method() == http::verb::head;
    const std::string target(sv(req.target()));
    const std::string path = target.substr(0, target.find('?'));
    const std::string method = head_ ? "GET" : std::string(sv(req.method_string()));
    const HttpRoute* route = nullptr;
    bool path_known = false;
    std::string allow;
    for (const HttpRoute& r : state_->routes) {
      if (!match(r.pattern, path, params_)) continue;
      path_known = true;
      allow += (allow.empty() ? "" : ", ") + r.method;
      if (r.method == method) {
        route = &r;
        break;
      }
    }
    if (!route) {
      if (!path_known) {
        refuse(json_error(404, "no route for " + method + " " + path, "invalid_request_error", {},
                          "not_found"));
      } else {
        HttpReply r = json_error(405, "method " + method + " is not allowed on " + path,
                                 "invalid_request_error", {}, "method_not_allowed");
        r.headers.emplace_back("Allow", allow);
        refuse(std::move(r));
      }
      return;
    }
    if (route->auth && !state_->api_keys.empty()) {
      const std::string_view auth = sv(req[http::field::authorization]);
      const std::string_view scheme = "Bearer ";
      const bool bearer = auth.size() > scheme.size() && lower(auth.substr(0, 7)) == "bearer ";
      if (!bearer || !api_key_matches(state_->api_keys, auth.substr(scheme.size()))) {
        HttpReply r = json_error(401,
                                 bearer ? "Incorrect API key provided."
                                        : "Missing bearer API key (Authorization: Bearer KEY).",
                                 "invalid_request_error", {}, "invalid_api_key");
        r.headers.emplace_back("WWW-Authenticate", "Bearer");
        refuse(std::move(r));
        return;
      }
    }
    const auto length = parser_->content_length();
    if ((length && *length > route->body_limit) || (req.chunked() && route->body_limit == 0)) {
      refuse(json_error(413,
                        "request body of " + (length ? std::to_string(*length) : "chunked") +
                            " bytes exceeds the limit of " + std::to_string(route->body_limit) +
                            " bytes for " + path,
                        "invalid_request_error", {}, "request_too_large"));
      return;
    }
    parser_->body_limit(route->body_limit);
    route_ = route;
    stream_.expires_after(state_->limits.read_timeout);
    if (lower(sv(req[http::field::expect])) == "100-continue") {
      // curl asks before sending a large body; say yes (the size was accepted above).
      continue_ = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*continue_),
                       [self = shared_from_this()](beast::error_code wec, size_t) {
                         if (wec) return;
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  // Answers a request before its body is read. The body is then still unread on the socket:
  // close afterwards.
  void refuse(HttpReply r) {
    const auto& req = parser_->get();
    if (req.has_content_length() || req.chunked()) {
      keep_alive_ = false;
      linger_ = true;
    }
    send(std::move(r));
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::on_body, shared_from_this()));
  }

  void on_body(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      linger_ = true;
      send(json_error(
          413, "request body exceeds the limit of " + std::to_string(route_->body_limit) + " bytes",
          "invalid_request_error", {}, "request_too_large"));
      return;
    }
    if (ec) return;
    auto& req = parser_->get();
    HttpRequest r;
    r.method = head_ ? "GET" : std::string(sv(req.method_string()));
    r.head = head_;
    r.target = std::string(sv(req.target()));
    const auto q = r.target.find('?');
    r.path = r.target.substr(0, q);
    if (q != std::string::npos) r.query = r.target.substr(q + 1);
    r.params = std::move(params_);
    for (const auto& f : req) r.headers.emplace_back(lower(sv(f.name_string())), sv(f.value()));
    r.body = std::move(req.body());
    stream_.expires_never();  // the handler may take its time; the watch notices a dead client
    auto exchange = std::make_shared<HttpExchange>(shared_from_this(), std::move(r));
    exchange_ = exchange;
    const uint64_t gen = ++gen_;
    try {
      route_->handler(exchange);
    } catch (const std::exception& e) {
      // A handler bug must not take the daemon down: this request fails alone (a started
      // stream can only be cut).
      spdlog::error("http {} {}: {}", exchange->request().method, exchange->request().path,
                    e.what());
      if (exchange->streaming()) {
        exchange->abort();
      } else {
        exchange->reply(json_error(500, "internal error", "server_error"));
      }
    }
    if (!exchange->done() && gen == gen_) watch(gen);
  }

  // While a reply is pending, wait for the socket to become readable: with nothing to read it
  // means the peer closed (or reset) the connection. Pipelined bytes end the watch instead.
  // A download (a body of known length) is the exception: a client may shut its sending side
  // once its request is out (`nc -N`, scripts that call shutdown(SHUT_WR)) and still read,
  // so there the end of its input only ends keep-alive; a client truly gone fails the next
  // write. A pending job's reply or event stream still ends at the end of input: nothing
  // would be written to find out for a long while, and the job is cancelled at once.
  void watch(uint64_t gen) {
    stream_.socket().async_wait(tcp::socket::wait_read,
                                [self = shared_from_this(), gen](beast::error_code ec) {
                                  if (gen != self->gen_ || !self->exchange_)
                                    return;  // that exchange is over
                                  if (ec == net::error::operation_aborted) return;
                                  beast::error_code aec;
                                  const size_t avail = self->stream_.socket().available(aec);
                                  if (!ec && !aec && avail > 0)
                                    return;  // a pipelined request: stop watching
                                  if (!ec && !aec && self->sized_ && self->exchange_->streaming()) {
                                    self->keep_alive_ = false;  // half-closed: finish, then close
                                    return;
                                  }
                                  self->client_gone();
                                });
  }


  void on_written(beast::error_code ec, size_t) {
    if (ec || !keep_alive_) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      // A deferred reply's disconnect watch may still wait on the socket, holding this session,
      // and no timer runs now: a client that keeps its end open would keep the session (and
      // its place under max_connections) forever. End the watch; the session then goes as soon
      // as the lingering close below is over, or at once.
      stream_.socket().cancel(ignored);
      if (!ec && linger_) {
        // Refused with its body unread: closing now would reset the connection while the
        // client is still sending, and it might never read the reply. Read and drop what
        // comes for a short while first (a "lingering close", as nginx does).
        stream_.expires_after(std::chrono::seconds(2));
        discard();
      }
      return;
    }
    do_read(/*first=*/false);
  }

  // When a reply of `bytes` (header aside) starting now must be out: write_timeout plus its
  // length at min_send_rate (HttpLimits::min_send_rate; none without a floor).
  Clock::time_point body_deadline(uint64_t bytes) const {
    const HttpLimits& l = state_->limits;
    if (l.min_send_rate == 0) return Clock::time_point::max();
    // Whole seconds, rounded up; capped at a week, so that no length overflows the clock.
    const uint64_t seconds = std::min<uint64_t>(bytes / l.min_send_rate + 1, 7 * 86400);
    return Clock::now() + l.write_timeout + std::chrono::seconds(seconds);
  }
  // The next write's deadline: write_timeout from now, and no later than the reply's.
  void arm_write() {
    stream_.expires_at(std::min(Clock::now() + state_->limits.write_timeout, body_deadline_));
  }

  void discard() {
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (!ec) self->discard();
                            });
  }

  void flush() {
    if (!out_.empty()) {
      sending_ = std::move(out_);
      out_.clear();
      writing_ = true;
      arm_write();
      auto done = beast::bind_front_handler(&HttpSession::on_chunk, shared_from_this());
      if (sized_) {
        net::async_write(stream_, net::buffer(sending_), std::move(done));
      } else {
        net::async_write(stream_, http::make_chunk(net::buffer(sending_)), std::move(done));
      }
      return;
    }
    if (ending_) {
      ending_ = false;
      ++gen_;
      exchange_.reset();
      if (sized_) {
        // Nothing closes a sized body; one ended short of its length must close the connection,
        // or the client would wait for the rest.
        if (left_ != 0 && !head_) keep_alive_ = false;
        net::post(stream_.get_executor(),
                  [self = shared_from_this()] { self->on_written(beast::error_code(), 0); });
        return;
      }
      writing_ = true;
      arm_write();
      net::async_write(stream_, http::make_chunk_last(),
                       beast::bind_front_handler(&HttpSession::on_written, shared_from_this()));
      return;
    }
    if (exchange_) exchange_->drained();  // everything queued has gone: the next piece, if any
  }

  void on_chunk(beast::error_code ec, size_t) {
    writing_ = false;
    // A download's megabyte is not kept for the rest of a keep-alive connection's life.
    if (sending_.capacity() > (64u << 10)) {
      std::string().swap(sending_);
    } else {
      sending_.clear();
    }
    if (ec) {
      client_gone();  // a slow or vanished reader: the stream is over
      return;
    }
    flush();
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::State> state_;
  std::string address_;  // counted in state_->per_address; empty: loopback, not counted
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::vector<std::string> params_;
  const HttpRoute* route_ = nullptr;
  bool keep_alive_ = true;
  bool head_ = false;
  bool linger_ = false;  // a refused request's body is still coming: drain before closing
  std::array<char, 8192> scratch_{};
  std::shared_ptr<std::string> continue_;
  std::shared_ptr<HttpExchange> exchange_;  // the pending exchange (a cycle broken at its end)
  uint64_t gen_ = 0;                        // bumped whenever an exchange ends
  // Whole replies.
  std::optional<http::response<http::string_body>> res_;
  // Streams: header serializer, then chunks.
  std::optional<http::response<http::empty_body>> sres_;
  std::optional<http::response_serializer<http::empty_body>> sr_;
  std::string out_, sending_;
  bool writing_ = false, ending_ = false;
  bool sized_ = false;  // the stream is a body of a known length, not chunks
  Clock::time_point body_deadline_ = Clock::time_point::max();  // of the reply being written
  uint64_t left_ = 0;   // bytes of a sized body not yet queued
};

HttpExchange::HttpExchange(std::shared_ptr<HttpSession> session, HttpRequest request)
    : session_(std::move(session)), request_(std::move(request)) {}

void HttpExchange::reply(HttpReply r) {
  if (done_ || streaming_) return;
  done_ = true;
  auto s = std::move(session_);
  if (s) s->send(std::move(r));
}

void HttpExchange::begin_stream(int status, std::string content_type, HttpHeaders headers) {
  if (done_ || streaming_ || !session_) return;
  streaming_ = true;
  session_->begin_stream(status, std::move(content_type), std::move(headers));
}

void HttpExchange::begin_body(int status, std::string content_type, uint64_t length,
                              HttpHeaders headers) {
  if (done_ || streaming_ || !session_) return;
  streaming_ = true;
  session_->begin_stream(status, std::move(content_type), std::move(headers), length);
}

void HttpExchange::write(std::string_view data) {
  if (done_ || !streaming_ || !session_) return;
  session_->stream_write(data);
}

void HttpExchange::write(std::string&& data) {
  if (done_ || !streaming_ || !session_) return;
  session_->stream_write(std::move(data));
}

void HttpExchange::when_drained(std::function<void()> f) {
  if (done_ || !streaming_ || !session_) return;
  on_drained_ = std::move(f);
  session_->notify_when_drained();
}

void HttpExchange::drained() {
  if (done_) return;
  if (auto f = std::move(on_drained_)) {
    on_drained_ = nullptr;
    // Called from the session's write completion: an exception must end this exchange, not
    // leave io_context::run.
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::error("http {} {}: {}", request_.method, request_.path, e.what());
      abort();
    }
  }
}

void HttpExchange::end_stream() {
  if (done_ || !streaming_) return;
  done_ = true;
  streaming_ = false;
  on_drained_ = nullptr;
  auto s = std::move(session_);
  if (s) s->stream_end();
}

void HttpExchange::abort() {
  if (done_) return;
  done_ = true;
  streaming_ = false;
  on_drained_ = nullptr;
  auto s = std::move(session_);
  if (s) s->client_gone();
}

void HttpExchange::disconnected() {
  if (done_) return;
  done_ = true;
  streaming_ = false;
  on_drained_ = nullptr;
  session_.reset();
  if (auto f = std::move(on_disconnect_)) f();
}

HttpServer::HttpServer(net::io_context& io, const std::string& host, int port, HttpLimits limits)
    : acceptor_(io), accept_timer_(io), state_(std::make_shared<State>()) {
  MB_CHECK(port >= 0 && port <= 65535, "http port out of range");
  state_->limits = limits;
  beast::error_code ec;
  const auto address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) throw InputError("http_host '" + host + "': " + ec.message());
  const tcp::endpoint ep(address, static_cast<unsigned short>(port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error("http server: cannot listen on " + host + ":" + std::to_string(port) + ": " +
                ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(HttpRoute r) { state_->routes.push_back(std::move(r)); }

void HttpServer::set_api_keys(std::vector<std::string> keys) { state_->api_keys = std::move(keys); }

const HttpCounters& HttpServer::counters() const { return state_->counters; }

void HttpServer::start() { do_accept(); }

void HttpServer::stop() {
  beast::error_code ignored;
  acceptor_.close(ignored);
  accept_timer_.cancel();
}

void HttpServer::do_accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;  // stop(): the normal end
    if (ec) {
      accept_failed(ec);
      return;
    }
    State& st = *state_;
    if (st.accept_failing) {
      st.accept_failing = false;
      const auto now = std::chrono::steady_clock::now();
      if (!st.accept_logged_at || now - *st.accept_logged_at >= st.limits.accept_log_every) {
        spdlog::info("http server: accepting again ({} failed accepts in all)",
                     st.counters.accept_failures);
        st.accept_logged_at = now;
      }
    }
    beast::error_code aec;
    const auto peer = socket.remote_endpoint(aec).address();
    std::string address = aec ? std::string() : http_client_group(peer);
    auto session = std::make_shared<HttpSession>(std::move(socket), state_, address);
    if (st.counters.open > st.limits.max_connections) {
      session->reject(/*per_address=*/false);
    } else if (!address.empty() &&
               st.per_address[address] > st.limits.max_connections_per_address) {
      session->reject(/*per_address=*/true);
    } else {
      session->start();
    }
    if (acceptor_.is_open()) do_accept();
  });
}

std::string http_client_group(const net::ip::address& address) {
  auto peer = address;
  // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d; count (and exempt) them as the
  // IPv4 address they are.
  if (peer.is_v6() && peer.to_v6().is_v4_mapped())
    peer = net::ip::make_address_v4(net::ip::v4_mapped, peer.to_v6());
  // Loopback is not capped per address: a local proxy brings every client from there.
  if (peer.is_loopback()) return {};
  if (peer.is_v4()) return peer.to_string();
  auto bytes = peer.to_v6().to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);  // the interface identifier
  return net::ip::address_v6(bytes).to_string() + "/64";
}

void HttpServer::accept_failed(const boost::system::error_code& ec) {
  State& st = *state_;
  ++st.counters.accept_failures;
  st.accept_failing = true;
  const auto now = std::chrono::steady_clock::now();
  if (!st.accept_logged_at || now - *st.accept_logged_at >= st.limits.accept_log_every) {
    spdlog::warn("http server: accept failed: {}{}", ec.message(),
                 st.accept_unlogged > 0
                     ? fmt::format(" ({} more since the last report)", st.accept_unlogged)
                     : std::string());
    st.accept_logged_at = now;
    st.accept_unlogged = 0;
  } else {
    ++st.accept_unlogged;
  }
  if (!acceptor_.is_open()) return;
  // A connection that went away before it was accepted is that connection's problem: accept
  // the next one now. Anything else (out of descriptors, or of kernel memory) stays true until
  // something is freed, and the pending connection keeps the listener readable: accepting again
  // at once would spin a core and starve every other handler. Wait instead.
  namespace errc = boost::system::errc;
  if (ec == errc::connection_aborted || ec == errc::protocol_error) {
    do_accept();
    return;
  }
  accept_timer_.expires_after(st.limits.accept_backoff);
  accept_timer_.async_wait([this](const boost::system::error_code& tec) {
    if (tec) return;  // operation_aborted: stop()
    if (acceptor_.is_open()) do_accept();
  });
}

}  // namespace moebatch
