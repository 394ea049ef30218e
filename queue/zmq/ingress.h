// The ZeroMQ ingress: a ROUTER socket speaking the v1 JSON protocol (queue/zmq/protocol.h) in
// front of the job store, and a PUB socket publishing completion notices.
//
// Threads (why not Asio's reactor): ZeroMQ sockets are not file descriptors Asio can wait on.
// The alternative, ZMQ_FD, is edge-triggered: it signals only when ZMQ_EVENTS changes, so after
// every wake-up AND after every send one must drain until EAGAIN or miss messages forever, and
// the socket would still have to stay on one thread. The store work (SQLite commits that may
// wait on the file lock) must not run on an io_context either. So the ingress runs:
// - a socket thread: zmq_poll over the ROUTER, the reply PULL, the notice PULL and a control
//   PAIR; it only parses, validates and moves bytes, and never blocks on the store;
// - a store thread (queue/zmq/store_worker.h) owning the JobStore;
// - with CURVE, a ZAP thread (queue/zmq/curve.h).
// Every socket belongs to exactly one thread; the other threads reach it through inproc
// hand-offs. The owner (`moebatch serve`) calls publish_completion() from any thread (the
// service's final-job hook) and stop() when it shuts down: from its signal handler with
// --no-engine, after the service has drained otherwise. The on_committed callback
// (StoreWorkerOptions) runs on the store thread. Nothing else is shared.
//
// Limits: ZMQ_MAXMSGSIZE (the transport drops a peer that sends a bigger frame), an application
// limit below it (max_request_bytes: answered with "too_large"), a cap on jobs per message,
// RCVHWM/SNDHWM, ZMQ_ROUTER_MANDATORY (a reply that cannot be delivered is counted and logged,
// never dropped silently), and a bounded store queue whose overflow is answered with "busy".
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "queue/job_store.h"
#include "queue/zmq/curve.h"
#include "queue/zmq/protocol.h"
#include "queue/zmq/store_worker.h"

namespace moebatch::zmq_ingress {

/// CURVE server configuration: the server's key pair and the client keys to admit.
struct CurveServerConfig {
  CurveKeyPair server;                     ///< server key pair (Z85)
  std::set<std::string> allowed_clients;   ///< client public keys, 32-byte binary
};

/// How to run an ingress.
struct IngressOptions {
  std::string bind = "tcp://127.0.0.1:5555";  ///< ROUTER endpoint ("tcp://127.0.0.1:*" works)
  std::optional<std::string> pub;             ///< PUB endpoint for completion notices
  StoreOptions store;                         ///< the job database
  ProtocolLimits limits;                      ///< request-level limits
  /// ZMQ_MAXMSGSIZE, per frame; must exceed limits.max_request_bytes. Unset:
  /// default_max_message_bytes(limits).
  std::optional<int64_t> max_message_bytes;
  int rcv_hwm = 1000;                         ///< ROUTER ZMQ_RCVHWM, messages
  int snd_hwm = 1000;                         ///< ROUTER ZMQ_SNDHWM, messages per peer
  int pub_hwm = 100000;                       ///< PUB ZMQ_SNDHWM per subscriber
  int notice_hwm = 100000;                    ///< notices waiting for the socket thread
  StoreWorkerOptions worker;                  ///< store queue capacity, group commit, hooks
  std::optional<CurveServerConfig> curve;     ///< CURVE on both sockets when set
};

/// Default ZMQ_MAXMSGSIZE headroom over the request limit: a body frame up to this much over
/// the limit still gets its too_large reply; a bigger one drops the connection. Kept small
/// because libzmq holds every frame of a multipart message before the ingress sees any
/// (docs/zmq.md, Limits).
inline constexpr int64_t kFrameHeadroom = 64 << 10;

/// The ZMQ_MAXMSGSIZE an ingress uses when IngressOptions::max_message_bytes is unset:
/// max_request_bytes + kFrameHeadroom. The one place that decides it (serve, the demo, tests).
inline int64_t default_max_message_bytes(const ProtocolLimits& limits) {
  return static_cast<int64_t>(limits.max_request_bytes) + kFrameHeadroom;
}

/// One job reaching a final state, as announced on the PUB socket.
struct CompletionNotice {
  int64_t job_id = 0;                    ///< job id
  std::optional<std::string> key;        ///< client key, if any
  std::optional<std::string> batch_id;   ///< batch, if any (the topic)
  JobState state = JobState::Done;       ///< done | failed | cancelled
  std::optional<std::string> error;      ///< failure reason, if any
};

/// The PUB topic of a batch: "batch/<id>" followed by a NUL byte, so subscribing to the whole
/// topic matches that batch exactly and not "<id>x". Jobs without a batch use "batch/" + NUL.
std::string notice_topic(const std::optional<std::string>& batch_id);
/// The JSON body of a notice: {"v":1,"event":"job_final","job_id","key","batch_id","state","error"}.
std::string notice_body(const CompletionNotice& n);

/// The running ingress. Constructed = bound and serving; destroyed = stopped.
class Ingress {
 public:
  /// Opens the store, binds the sockets and starts the threads. Throws Error (or InputError
  /// for bad options) when anything cannot be set up, e.g. CURVE without a ZAP handler.
  explicit Ingress(IngressOptions options);
  /// stop().
  ~Ingress();
  Ingress(const Ingress&) = delete;
  Ingress& operator=(const Ingress&) = delete;

  /// The ROUTER's actual endpoint (resolves a "*" port).
  const std::string& router_endpoint() const { return router_endpoint_; }
  /// The PUB's actual endpoint, empty without one.
  const std::string& pub_endpoint() const { return pub_endpoint_; }

  /// Thread-safe. Hands a notice to the socket thread for the PUB socket. Returns false, and
  /// counts it, when the hand-off is full (notice_hwm); true otherwise, including when no PUB
  /// endpoint is configured. PUB itself drops for subscribers past pub_hwm (ZeroMQ semantics):
  /// notices are hints, the store is the record (a producer can always ask for "status").
  bool publish_completion(const CompletionNotice& notice);

  /// Thread-safe, idempotent. Stops reading requests, answers every accepted one (commits
  /// included), flushes replies and notices, and joins the threads.
  void stop();

  /// Counters, readable from any thread.
  const IngressCounters& counters() const { return counters_; }
  /// ZAP allow/deny counts (zero without CURVE).
  uint64_t zap_denied() const { return zap_ ? zap_->denied() : 0; }

 private:
  void run();
  void handle_request();
  void forward_replies(bool* ended);
  void forward_notices();
  void send_to_router(std::vector<zmq::message_t>& frames);
  void send_error(const std::vector<std::string>& envelope, const nlohmann::json& id,
                  const ProtocolError& err);

  IngressOptions options_;
  IngressCounters counters_;
  zmq::context_t ctx_;  // destroyed last: every socket below is closed before it
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t router_;
  zmq::socket_t pub_;
  zmq::socket_t replies_in_;   // PULL from the store thread
  zmq::socket_t notices_in_;   // PULL from publish_completion
  zmq::socket_t control_in_;   // PAIR: stop()
  std::mutex notices_mu_;      // guards notices_out_
  zmq::socket_t notices_out_;  // PUSH; any thread, under notices_mu_
  std::mutex control_mu_;      // guards control_out_ and stopped_
  zmq::socket_t control_out_;  // PAIR; stop() only
  bool stopped_ = false;
  std::string router_endpoint_, pub_endpoint_;
  std::unique_ptr<StoreWorker> worker_;
  std::thread thread_;
};

}  // namespace moebatch::zmq_ingress
