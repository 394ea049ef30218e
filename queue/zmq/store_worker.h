// The store side of the ingress: one thread that owns the JobStore (one SQLite connection per
// thread, as JobStore requires) and answers parsed requests.
//
// Hand-off contract (the socket thread is the only producer, this thread the only consumer):
// - try_push() never blocks; it returns false when `capacity` requests are already waiting,
//   and the socket thread then replies "busy" at once instead of queueing without bound.
// - Replies travel back over an inproc PUSH socket that only this thread touches; the socket
//   thread forwards them to the ROUTER. A submit's reply is produced only after
//   JobStore::submit_many has committed, so an ack always means the jobs are durable.
// - Consecutive submits waiting in the queue are committed in ONE transaction (group commit):
//   one fsync/lock round for many producers, the main lever for acked jobs per second. When a
//   reused key (KeyConflictError) fails the group, each request is committed alone, so only
//   the one with the conflict gets the key_conflict reply.
// - close() stops intake; the thread answers everything already accepted, then sends an empty
//   one-frame "end" message on the reply socket and exits.
// - `stats` answers the queue part (JobStore::stats: counts, latency over the newest done jobs)
//   from a snapshot kept for StoreWorkerOptions::stats_max_age, so a flood of stats requests
//   costs one store query per second; the ingress counters are read live.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "queue/job_store.h"
#include "queue/zmq/protocol.h"

namespace moebatch::zmq_ingress {

/// Where a test may make the service die (docs/zmq.md "Crash hook"). Never set in production.
enum class CrashPoint { None, BeforeCommit, AfterCommit };

/// Counters shared by the ingress threads; every field may be read from any thread.
struct IngressCounters {
  std::atomic<uint64_t> requests{0};        ///< well-formed requests accepted for the store
  std::atomic<uint64_t> jobs_created{0};    ///< jobs inserted by acked submits
  std::atomic<uint64_t> jobs_existing{0};   ///< submitted keys that already existed
  std::atomic<uint64_t> commits{0};         ///< submit transactions committed
  std::atomic<uint64_t> errors{0};          ///< error replies sent (all codes)
  std::atomic<uint64_t> busy{0};            ///< busy replies (hand-off full or store locked)
  std::atomic<uint64_t> undeliverable{0};   ///< replies ROUTER could not send (peer gone/full)
  std::atomic<uint64_t> notices{0};         ///< completion notices published
  std::atomic<uint64_t> notices_refused{0};  ///< publish_completion calls refused (hand-off full)
};

/// One accepted request on its way to the store thread, with the ROUTER envelope that routes
/// its reply back to the peer.
struct RoutedRequest {
  std::vector<std::string> envelope;  ///< routing id, plus "" for REQ-style peers
  Request request;                    ///< parsed and validated
};

/// Knobs of the store thread.
struct StoreWorkerOptions {
  size_t capacity = 256;              ///< requests waiting for the store; more get "busy"
  size_t max_jobs_per_commit = 8192;  ///< group-commit bound, in jobs
  CrashPoint crash_point = CrashPoint::None;  ///< test hook; see CrashPoint
  /// How long a stats reply reuses the queue snapshot it read (0: read it for every request).
  /// A read that took d is also kept for 10 d at least, so on a table where stats is slow the
  /// store thread, and the submits waiting behind it, spend at most a tenth of it on stats.
  std::chrono::milliseconds stats_max_age{1000};
  std::function<void(size_t)> on_committed;   ///< called (store thread) with jobs created
};

/// The store thread. See the file comment for the hand-off contract.
class StoreWorker {
 public:
  /// Takes ownership of store (opened by the caller so open errors surface at start-up) and
  /// connects a PUSH socket to reply_endpoint, then starts the thread.
  StoreWorker(zmq::context_t& ctx, const std::string& reply_endpoint,
              std::unique_ptr<JobStore> store, StoreWorkerOptions options,
              IngressCounters& counters);
  /// close() and join().
  ~StoreWorker();
  StoreWorker(const StoreWorker&) = delete;
  StoreWorker& operator=(const StoreWorker&) = delete;

  /// Queues item; false (item untouched) when the queue is full or closed. Never blocks.
  bool try_push(RoutedRequest& item);
  /// No more items; queued ones are still answered, then the end marker is sent.
  void close();
  /// Waits for the thread to finish.
  void join();

 private:
  void run();
  void process(std::vector<RoutedRequest>& items);
  void commit_submits(std::vector<RoutedRequest>& items, size_t begin, size_t end);
  void answer_one(RoutedRequest& item);
  void answer_batch(const RoutedRequest& item);
  void reply(const RoutedRequest& item, const std::string& body);
  void reply_error(const RoutedRequest& item, const ProtocolError& err);
  void crash_if(CrashPoint point);
  nlohmann::json queue_stats();

  std::unique_ptr<JobStore> store_;
  StoreWorkerOptions options_;
  IngressCounters& counters_;
  zmq::socket_t replies_;  // PUSH; used only by thread_ once it runs
  // The last queue snapshot for stats (thread_ only): stats_to_json's object, when it was
  // read, and until when it is reused.
  nlohmann::json stats_json_;
  std::chrono::steady_clock::time_point stats_read_at_{};
  std::chrono::steady_clock::time_point stats_fresh_until_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RoutedRequest> queue_;  // guarded by mu_
  bool closed_ = false;         // guarded by mu_
  std::thread thread_;
};

}  // namespace moebatch::zmq_ingress
