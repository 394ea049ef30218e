// Persistent threads that drive tensor-parallel ranks, one per rank: the CUDA runtime's current
// device and the graph-capture mode are per host thread, and a collective blocks its caller
// until every rank has joined, so each rank needs its own thread. With one rank there is no
// thread: run_all calls the function on the caller, so a single GPU pays no cross-thread hop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moebatch {

/// N persistent rank threads. Thread contract: one run_all at a time (the backend is driven by
/// one engine thread); the destructor must not race a run_all.
class RankThreads {
 public:
  /// Starts `ranks` threads (none when ranks == 1).
  explicit RankThreads(int ranks);
  /// Stops and joins the threads (the work they ran has returned).
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  /// Ranks driven.
  int size() const { return ranks_; }
  /// Calls fn(r) on rank r's thread for every rank and waits for all of them; then rethrows
  /// the first exception a rank threw (the others still ran to their end).
  template <class F>
  void run_all(F&& fn) {
    if (ranks_ == 1) {
      fn(0);
      return;
    }
    const std::function<void(int)> job = std::ref(fn);
    dispatch(job);
  }

 private:
  void dispatch(const std::function<void(int)>& job);
  void worker(int rank);

  int ranks_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;  // valid while pending_ > 0
  uint64_t generation_ = 0;                        // bumped once per run_all
  int pending_ = 0;                                // ranks still running the job
  bool stop_ = false;
  std::exception_ptr error_;  // first failure of the job
};

}  // namespace moebatch
