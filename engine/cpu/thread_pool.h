// A small fixed-size thread pool for data-parallel loops. One pool per tensor-parallel rank is
// passed explicitly to the ops that use it; there is no process-wide pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moebatch {

/// Runs parallel_for loops on `num_threads` threads (the caller counts as one of them).
class ThreadPool {
 public:
  /// num_threads >= 1; with 1 every loop runs inline on the caller.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Splits [0, n) into one contiguous chunk per thread and calls fn(begin, end) on each; returns
  /// when all chunks are done. fn must not throw. Not reentrant: one loop at a time per pool.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
  /// Number of threads including the caller.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void worker_main(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace moebatch
