// The daemon's HTTP/1.1 server (Boost.Beast): /health, /metrics and the OpenAI-compatible API,
// in the shape of the Asio HTTP server example: a listener that accepts, one session object per
// connection kept alive by shared_from_this, and a small router from (method, path) to a handler.
//
// - Keep-alive: a connection serves requests one after another until the client closes it, asks
//   for `Connection: close`, or stays idle for `idle_timeout`.
// - Bodies: each route has its own size limit, checked against Content-Length before a byte of
//   the body is read (413 and close), and while reading a chunked body.
// - Long-lived replies: a handler may keep its HttpExchange and answer later (a job's result), or
//   stream (server-sent events in chunked transfer encoding). Nothing blocks: other connections
//   are served meanwhile. While a reply is pending the session watches the socket, so a client
//   that goes away is noticed at once and the exchange's disconnect callback runs (the API
//   cancels the job).
// - Limits: at most `max_connections` open connections, and `max_connections_per_address` from
//   one address other than loopback, an IPv6 /64 counting as one (beyond either: 503 and
//   close); header size;
//   read, idle and write timeouts, so a slow or silent client cannot hold a connection forever;
//   a reply of known length has a deadline for its whole body too (`min_send_rate`).
// - Out of descriptors (EMFILE/ENFILE, or kernel buffers): the connection stays in the listen
//   backlog and accept would fail again at once, so the listener waits `accept_backoff` before
//   the next try instead of spinning, and logs the failure once per `accept_log_every` with a
//   count of the ones it did not print.
// - Auth: with API keys set, routes marked `auth` need `Authorization: Bearer <key>`; keys are
//   compared in constant time. /health and /metrics stay open, as in vLLM.
// Errors the server itself produces (404, 405, 401, 413, 503) use OpenAI's error shape.
//
// Thread-safety: everything, handlers and HttpExchange included, runs on the io_context's one
// thread. operation_aborted on stop is the normal end, not an error.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moebatch {

/// Extra response headers, (name, value).
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

/// A whole reply.
struct HttpReply {
  HttpReply() = default;
  /// A reply of `status` with a body of `content_type`.
  HttpReply(int status_, std::string content_type_, std::string body_, HttpHeaders headers_ = {})
      : status(status_),
        content_type(std::move(content_type_)),
        body(std::move(body_)),
        headers(std::move(headers_)) {}

  int status = 200;                         ///< HTTP status code
  std::string content_type = "text/plain";  ///< Content-Type header
  std::string body;                         ///< response body
  HttpHeaders headers;                      ///< extra headers (Retry-After, Allow, ...)
};

/// A reply in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}; empty
/// `param` / `code` become null.
HttpReply json_error(int status, std::string_view message, std::string_view type,
                     std::string_view param = {}, std::string_view code = {});

/// One request as the handler sees it.
struct HttpRequest {
  std::string method;               ///< "GET", "POST", ... (HEAD is routed as GET)
  bool head = false;                ///< a HEAD request: the reply's body is not sent
  std::string target;               ///< request target as sent
  std::string path;                 ///< target without the query string
  std::string query;                ///< after '?', empty when none
  std::vector<std::string> params;  ///< path segments that matched '*' in the route
  HttpHeaders headers;              ///< header names lower-cased
  std::string body;                 ///< the request body (within the route's limit)
  /// First value of header `lower_name`, empty when absent.
  std::string header(std::string_view lower_name) const;
};

class HttpSession;

/// The reply channel of one request. A handler answers at once (reply), later, or as a stream
/// (begin_stream or begin_body, write..., end_stream); the connection stays open until it does.
/// Calls after the exchange is done (answered, or the client went away) do nothing. io thread
/// only.
class HttpExchange {
 public:
  HttpExchange(std::shared_ptr<HttpSession> session, HttpRequest request);
  /// The request.
  const HttpRequest& request() const { return request_; }
  /// Sends a whole reply; ends the exchange.
  void reply(HttpReply r);
  /// Starts a chunked reply (e.g. text/event-stream) with `status` and extra headers.
  void begin_stream(int status, std::string content_type, HttpHeaders headers = {});
  /// Starts a reply whose body of `length` bytes follows in writes (Content-Length, not
  /// chunked: a download whose size is known). For HEAD only the header is sent and writes are
  /// dropped. Ending it short of `length` closes the connection (the client sees the body cut).
  void begin_body(int status, std::string content_type, uint64_t length, HttpHeaders headers = {});
  /// Queues bytes on a started stream; sent as soon as the socket takes them.
  void write(std::string_view data);
  /// As above, taking the buffer over instead of copying it when nothing else waits (a
  /// download's piece).
  void write(std::string&& data);
  void write(const char* data) { write(std::string_view(data)); }
  /// Runs `f` once every byte queued so far has gone to the socket (posted at once when none
  /// waits): a large body is written a piece at a time, each after the last has left. Not run
  /// when the exchange ends first.
  void when_drained(std::function<void()> f);
  /// Ends the stream after the queued bytes; ends the exchange.
  void end_stream();
  /// Ends the exchange by closing the connection: for a started body that cannot be finished
  /// (its source failed); the client sees it cut short.
  void abort();
  /// Runs `f` once if the client goes away before the exchange ends.
  void on_disconnect(std::function<void()> f) { on_disconnect_ = std::move(f); }
  /// True once answered, ended, or the client went away.
  bool done() const { return done_; }
  /// True between begin_stream and the end of the exchange.
  bool streaming() const { return streaming_; }

 private:
  friend class HttpSession;
  void disconnected();
  void drained();  // the session took every queued byte: runs on_drained_ once

  std::shared_ptr<HttpSession> session_;  // released when the exchange ends
  HttpRequest request_;
  std::function<void()> on_disconnect_;
  std::function<void()> on_drained_;
  bool done_ = false;
  bool streaming_ = false;
};

/// Handles one request; runs on the io thread.
using HttpHandler = std::function<void(const std::shared_ptr<HttpExchange>&)>;

/// One route: method and path pattern ("/v1/models", "/v1/files/*": '*' matches one segment).
struct HttpRoute {
  std::string method;     ///< "GET", "POST", "DELETE", ...
  std::string pattern;    ///< path, '*' for one segment
  size_t body_limit = 0;  ///< largest accepted body, bytes (0: none accepted)
  bool auth = false;      ///< needs a bearer key when keys are set
  HttpHandler handler;    ///< what answers
};

/// Connection limits and timeouts.
struct HttpLimits {
  size_t max_connections = 256;                   ///< open connections; beyond: 503 and close
  /// Open connections from one address other than loopback; beyond: 503 and close, so one host
  /// cannot hold every connection (clients behind a proxy on this machine arrive as loopback
  /// and share max_connections alone).
  size_t max_connections_per_address = 128;
  size_t max_header_bytes = 16 << 10;             ///< request line + headers
  std::chrono::seconds read_timeout{30};          ///< to read one request once it started
  std::chrono::seconds idle_timeout{60};          ///< keep-alive wait for the next request
  std::chrono::seconds write_timeout{60};         ///< to write one reply or stream chunk
  /// Bytes a second a reply of known length (a whole reply, a download) must average: it has
  /// write_timeout + length / min_send_rate in all, so a reader that takes each piece just
  /// inside write_timeout cannot hold its connection for hours. 0 = no floor. Event streams
  /// are paced by generation and have none.
  uint64_t min_send_rate = 64 << 10;
  std::chrono::milliseconds accept_backoff{100};  ///< wait after accept ran out of descriptors
  std::chrono::seconds accept_log_every{10};      ///< at most one accept-failure line this often
};

/// What the per-address cap counts a client as: empty for loopback (not capped); an IPv4 client
/// (also one a dual-stack listener sees as ::ffff:a.b.c.d) by its address; an IPv6 client by its
/// /64, the block one host is given and picks its addresses from (privacy addresses rotate within
/// it), written as the prefix ("2001:db8:0:7::/64").
std::string http_client_group(const boost::asio::ip::address& peer);

/// Live connection counts, for /metrics and tests.
struct HttpCounters {
  size_t open = 0;              ///< connections open now
  int64_t accepted = 0;         ///< connections accepted
  int64_t rejected = 0;         ///< refused at a connection cap (either)
  int64_t rejected_per_address = 0;  ///< of those, refused at the per-address cap
  int64_t requests = 0;         ///< requests read
  int64_t accept_failures = 0;  ///< accept calls that failed (EMFILE, ...)
};

/// Accepts connections on host:port and routes requests; see the file comment.
class HttpServer {
 public:
  /// Binds (port 0 = any free port) and listens; Error when the address cannot be bound.
  HttpServer(boost::asio::io_context& io, const std::string& host, int port,
             HttpLimits limits = {});
  ~HttpServer();
  /// Adds a route (before start()).
  void route(HttpRoute r);
  /// Bearer keys for routes marked `auth`; empty = no authentication.
  void set_api_keys(std::vector<std::string> keys);
  /// Starts accepting.
  void start();
  /// Stops accepting; open sessions finish their exchange.
  void stop();
  /// The bound port.
  int port() const { return port_; }
  /// Connection counters.
  const HttpCounters& counters() const;

  struct State;

 private:
  void do_accept();
  void accept_failed(const boost::system::error_code& ec);

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_timer_;  // the backoff after a failed accept
  std::shared_ptr<State> state_;
  int port_ = 0;
};

/// Whether `presented` equals one of `keys`; the time taken does not depend on where the
/// strings differ (every key is compared to the end).
bool api_key_matches(const std::vector<std::string>& keys, std::string_view presented);

}  // namespace moebatch
