// Loopback HTTP/1.1 server for /health and /metrics (Boost.Beast), in the shape of the Asio
// HTTP server example: a listener that accepts, one session object per connection kept alive by
// shared_from_this, and a handler that maps a request target to a reply. One request per
// connection; operation_aborted on stop is the normal end, not an error.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>

namespace moebatch {

/// What the handler returns for one request.
struct HttpReply {
  int status = 200;                         ///< HTTP status code
  std::string content_type = "text/plain";  ///< Content-Type header
  std::string body;                         ///< response body
};

/// Maps a GET target ("/health", "/metrics?x") to a reply; runs on the io_context thread.
using HttpHandler = std::function<HttpReply(const std::string& target)>;

/// Accepts connections on host:port and answers GET/HEAD through a handler.
class HttpServer {
 public:
  /// Binds (port 0 = any free port) and listens; Error when the address cannot be bound.
  HttpServer(boost::asio::io_context& io, const std::string& host, int port, HttpHandler handler);
  ~HttpServer();
  /// Starts accepting.
  void start();
  /// Stops accepting; open sessions finish their one exchange.
  void stop();
  /// The bound port.
  int port() const { return port_; }

 private:
  void do_accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<HttpHandler> handler_;
  int port_ = 0;
};

}  // namespace moebatch
