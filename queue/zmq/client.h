// Client side of the ingress protocol with Lazy-Pirate retries (ZeroMQ guide, chapter 4): a REQ
// socket sends the request and polls for the reply; on timeout the socket is closed and a fresh
// one resends the SAME bytes, up to `attempts` times, then the call fails. Resending is safe
// because every submit carries idempotency keys (submit_jobs() adds one to each job that has
// none), so a submit that was committed but whose ack was lost returns the same ids again.
//
// Thread-safety: one LazyPirateClient per thread (it owns a REQ socket).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "queue/job_store.h"
#include "queue/zmq/curve.h"

namespace moebatch::zmq_ingress {

/// CURVE settings of a client.
struct ClientCurve {
  std::string server_public_z85;  ///< the server's public key
  CurveKeyPair client;            ///< this client's key pair
};

/// How a client talks to an ingress.
struct ClientOptions {
  std::string endpoint;                         ///< e.g. tcp://127.0.0.1:5555
  std::chrono::milliseconds timeout{3000};      ///< wait for one reply
  int attempts = 4;                             ///< sends before giving up (>= 1)
  std::chrono::milliseconds busy_backoff{100};  ///< first wait after a "busy" reply (doubles)
  int64_t max_reply_bytes = 64 << 20;           ///< ZMQ_MAXMSGSIZE on the client socket
  /// submit_jobs keeps each message's body under this (the ingress's --max-request-bytes).
  size_t max_request_bytes = 4u << 20;
  std::optional<ClientCurve> curve;  ///< CURVE when set
};

/// A Lazy-Pirate request/reply client. See the file comment.
class LazyPirateClient {
 public:
  /// Validates options; connects lazily on the first call.
  explicit LazyPirateClient(ClientOptions options);
  ~LazyPirateClient();
  LazyPirateClient(const LazyPirateClient&) = delete;
  LazyPirateClient& operator=(const LazyPirateClient&) = delete;

  /// Sends request (an "id" is added when missing) and returns the reply object, whether ok or
  /// an error reply. Retries timeouts and retryable errors ("busy", "internal"); throws Error
  /// when no usable reply came after `attempts` sends, or when the reply is not valid protocol.
  nlohmann::json call(nlohmann::json request);

  /// Sends specs in messages of at most per_message jobs (each message acked after its commit)
  /// and returns one result per spec, in order. Jobs without a client key get a fresh random
  /// one so retries stay idempotent. Throws InputError for a rejected job, Error otherwise.
  std::vector<SubmitResult> submit_jobs(std::vector<JobSpec> specs, size_t per_message = 500);
  /// Called after each acked message of submit_jobs with the jobs acked so far.
  void on_progress(std::function<void(size_t)> progress) { progress_ = std::move(progress); }

  /// One batch_* command ("batch_status", "batch_cancel", ...) for batch_id, with `args`'
  /// members added to the request: the ok reply, which carries "batch" (queue/job_json.h
  /// batch_counts_to_json) and the command's own members. Throws InputError when the ingress
  /// refuses the request, Error when it cannot answer.
  nlohmann::json call_batch(std::string_view cmd, const std::string& batch_id,
                            const nlohmann::json& args = nlohmann::json::object());

  /// Sends so far, counting retries (for tests and the benchmark).
  int sends() const { return sends_; }

 private:
  void connect();

  ClientOptions options_;
  zmq::context_t ctx_;
  std::unique_ptr<zmq::socket_t> socket_;
  uint64_t next_id_ = 1;
  std::string id_prefix_;
  int sends_ = 0;
  std::function<void(size_t)> progress_;
};

/// A random 128-bit hex string, for request ids and generated idempotency keys.
std::string random_hex_token();

/// The `moebatch submit --endpoint` settings as given on the command line.
struct RemoteSubmitFlags {
  std::string endpoint;          ///< ingress ROUTER endpoint; empty = submit to the local db
  std::string curve_server_key;  ///< server public key file (enables CURVE)
  std::string curve_secret;      ///< client secret key file (required with CURVE)
  int timeout_ms = 3000;         ///< wait per attempt
  int attempts = 4;              ///< sends before giving up
};

/// ClientOptions from flags, loading key files. Throws InputError on bad flags or key files.
ClientOptions client_options_from(const RemoteSubmitFlags& flags);
/// Submits one job through the ingress with Lazy-Pirate retries (the CLI's --endpoint path).
SubmitResult submit_remote(const RemoteSubmitFlags& flags, const JobSpec& spec);

}  // namespace moebatch::zmq_ingress
