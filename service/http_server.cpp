#include "service/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/address.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>

#include "common/error.h"

namespace moebatch {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

/// One connection: read a request, write the reply, close.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, std::shared_ptr<HttpHandler> handler)
      : stream_(std::move(socket)), handler_(std::move(handler)) {}

  void start() {
    parser_.emplace();
    // Health checks carry no body; a small limit keeps a misbehaving client cheap.
    parser_->body_limit(4096);
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
  }

 private:
  void on_read(beast::error_code ec, size_t) {
    if (ec) return;  // closed, timed out, malformed or aborted: nothing to answer
    const auto& req = parser_->get();
    HttpReply reply;
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      reply = {405, "text/plain", "method not allowed\n"};
    } else {
      reply = (*handler_)(std::string(req.target()));
    }
    res_.version(req.version());
    res_.result(static_cast<http::status>(reply.status));
    res_.set(http::field::server, "moebatch");
    res_.set(http::field::content_type, reply.content_type);
    res_.keep_alive(false);
    res_.body() = req.method() == http::verb::head ? std::string() : std::move(reply.body);
    res_.prepare_payload();
    http::async_write(stream_, res_,
                      beast::bind_front_handler(&HttpSession::on_write, shared_from_this()));
  }

  void on_write(beast::error_code, size_t) {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  std::shared_ptr<HttpHandler> handler_;
};

}  // namespace

HttpServer::HttpServer(net::io_context& io, const std::string& host, int port, HttpHandler handler)
    : acceptor_(io), handler_(std::make_shared<HttpHandler>(std::move(handler))) {
  MB_CHECK(port >= 0 && port <= 65535, "http port out of range");
  beast::error_code ec;
  const auto address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) throw InputError("http_host '" + host + "': " + ec.message());
  const tcp::endpoint ep(address, static_cast<unsigned short>(port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error("health/metrics server: cannot listen on " + host + ":" + std::to_string(port) +
                ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint().port();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() { do_accept(); }

void HttpServer::stop() {
  beast::error_code ignored;
  acceptor_.close(ignored);
}

void HttpServer::do_accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;  // stop(): the normal end
    if (!ec) {
      std::make_shared<HttpSession>(std::move(socket), handler_)->start();
    } else {
      spdlog::warn("health/metrics server: accept failed: {}", ec.message());
    }
    if (acceptor_.is_open()) do_accept();
  });
}

}  // namespace moebatch
