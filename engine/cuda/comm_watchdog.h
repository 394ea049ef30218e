// The collective watchdog of the CUDA backend: while a step runs, a thread polls the device
// communicator for asynchronous errors and watches the step's wall time; on an error, a timeout or
// a rank's failure it aborts the communicator, so ranks blocked inside a collective (on the host
// or in a kernel waiting for a peer) return and the step throws instead of stalling forever.
// The engine's failure handling (jobs requeued, engine rebuilt) then takes over.
//
// Only the watchdog's thread calls AbortableComm::abort. NCCL's abort waits until every CUDA
// graph that captured one of the communicator's collectives is destroyed, so it must never run
// on a rank thread or the engine thread (they would wait on themselves); on the watchdog's thread
// it simply finishes when the backend destroys its ranks (CudaBackend destroys the ranks before
// the watchdog, and the watchdog before the communicator).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace moebatch {

/// What the watchdog needs from a device communicator (NcclComm implements it). Thread contract:
/// async_error, aborted and abort_reason may run concurrently with collectives on other threads;
/// abort runs on the watchdog's thread only, at most once.
class AbortableComm {
 public:
  virtual ~AbortableComm() = default;
  /// Empty when every rank's communicator is healthy, else a message naming the rank and error.
  virtual std::string async_error() = 0;
  /// Makes every rank's blocked and later collectives return; afterwards every collective call
  /// throws Error(reason). May block until the captured graphs are destroyed (see above).
  virtual void abort(const std::string& reason) = 0;
  /// abort() has begun.
  virtual bool aborted() const = 0;
  /// The reason given to abort() (empty before).
  virtual std::string abort_reason() const = 0;
};

/// One watchdog thread per tensor-parallel backend. begin_step/end_step come from the engine's
/// thread (one step at a time); progress and trip from any rank thread.
class CommWatchdog {
 public:
  /// Watches `comm` (not owned; must outlive the watchdog) for `world` ranks; a step longer than
  /// `timeout_s` seconds is a failure.
  CommWatchdog(AbortableComm& comm, int world, double timeout_s);
  /// Stops and joins the thread (waiting for an abort in progress to finish).
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  /// A step starts now: its clock and every rank's progress restart.
  void begin_step();
  /// The step is over. Returns the watchdog's own failure message (timeout or asynchronous error)
  /// when it aborted the communicator during this step or earlier, else empty; a trip() is not
  /// reported here (the rank that tripped rethrows its own error).
  std::string end_step();
  /// Rank `rank` made progress in this step (names the stuck rank in a timeout message).
  void progress(int rank) { progress_[rank].fetch_add(1, std::memory_order_relaxed); }
  /// Rank `rank` failed mid-step with `what`: abort the communicator now (its peers may be
  /// waiting for it inside a collective).
  void trip(int rank, const std::string& what);
  /// The watchdog has aborted (or is aborting) the communicator.
  bool fired() const;
  /// Why it fired (its own failure or a rank's trip); empty before. Set before the abort starts,
  /// so a step that begins after a failed one sees it even while the abort is still running.
  std::string abort_reason() const;

 private:
  void loop();
  std::string timeout_message() const;

  AbortableComm& comm_;
  const int world_;
  const double timeout_s_;
  const std::chrono::milliseconds poll_;
  std::unique_ptr<std::atomic<int>[]> progress_;  // [world] progress marks in the current step

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool active_ = false;  // a step is running
  std::chrono::steady_clock::time_point started_;
  std::string trip_;     // pending trip() reason
  std::string failure_;  // the watchdog's own failure (timeout / async error), once fired
  std::string reason_;   // what it fired for: failure_ or a trip
  bool fired_ = false;
  std::thread thread_;  // last: starts after every member above is initialized
};

}  // namespace moebatch
