// Helpers for the ingress tests: an ingress on an ephemeral loopback port over a fresh database,
// and raw DEALER/REQ peers that send arbitrary frames and wait for a reply with a timeout.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "queue/zmq/ingress.h"
#include "tests/common/files.h"
#include "tests/queue/queue_test_util.h"

namespace moebatch::test {

namespace zi = moebatch::zmq_ingress;

/// Options for an ingress on 127.0.0.1 with ephemeral ports over dir/jobs.db.
inline zi::IngressOptions loopback_options(const TempDir& dir) {
  zi::IngressOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.pub = "tcp://127.0.0.1:*";
  o.store.path = dir.path() / "jobs.db";
  return o;
}

/// A raw peer: a DEALER (frames sent as given) or a REQ (delimiter added by ZeroMQ).
class Peer {
 public:
  Peer(zmq::context_t& ctx, const std::string& endpoint,
       zmq::socket_type type = zmq::socket_type::dealer)
      : socket_(ctx, type) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  /// Sends frames as one multipart message.
  void send_frames(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  /// Sends one JSON body.
  void send(const nlohmann::json& j) { send_frames({j.dump()}); }
  /// The next message's frames, or nullopt after timeout_ms.
  std::optional<std::vector<std::string>> recv_frames(int timeout_ms = 5000) {
    zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return std::nullopt;
    std::vector<zmq::message_t> msgs;
    (void)zmq::recv_multipart(socket_, std::back_inserter(msgs));
    std::vector<std::string> out;
    for (auto& m : msgs) out.push_back(m.to_string());
    return out;
  }
  /// The next reply body parsed as JSON (last frame); fails the test on timeout.
  nlohmann::json recv(int timeout_ms = 5000) {
    auto frames = recv_frames(timeout_ms);
    if (!frames || frames->empty()) {
      ADD_FAILURE() << "no reply within " << timeout_ms << " ms";
      return nullptr;
    }
    return nlohmann::json::parse(frames->back());
  }
  /// send() then recv().
  nlohmann::json call(const nlohmann::json& j, int timeout_ms = 5000) {
    send(j);
    return recv(timeout_ms);
  }
  /// The socket, for options.
  zmq::socket_t& socket() { return socket_; }

 private:
  zmq::socket_t socket_;
};

/// A v1 submit request of the given job objects.
inline nlohmann::json submit_request(const nlohmann::json& id, nlohmann::json jobs) {
  return {{"v", 1}, {"cmd", "submit"}, {"id", id}, {"jobs", std::move(jobs)}};
}

}  // namespace moebatch::test
