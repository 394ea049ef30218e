#include "engine/cpu/thread_pool.h"

#include "common/error.h"

namespace moebatch {
namespace {

// Chunk `i` of `parts` over [0, n): sizes differ by at most one.
std::pair<int64_t, int64_t> chunk(int64_t n, int parts, int i) {
  return {n * i / parts, n * (i + 1) / parts};
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  MB_CHECK(num_threads >= 1 && num_threads <= 1024, "thread count must be in [1, 1024]");
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int parts = size();
  if (parts == 1 || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard lk(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = parts - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  auto [b, e] = chunk(n, parts, 0);
  if (b < e) fn(b, e);
  std::unique_lock lk(mu_);
  done_cv_.wait(lk, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_main(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    {
      std::unique_lock lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    auto [b, e] = chunk(n, size(), index);
    if (b < e) (*job)(b, e);
    std::lock_guard lk(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace moebatch
