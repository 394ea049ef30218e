#include "engine/cuda/rank_threads.h"

#include <utility>

#include "common/error.h"

namespace moebatch {

RankThreads::RankThreads(int ranks) : ranks_(ranks) {
  MB_CHECK(ranks >= 1, "RankThreads: need at least one rank");
  if (ranks == 1) return;
  try {
    threads_.reserve(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { worker(r); });
  } catch (...) {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankThreads::dispatch(const std::function<void(int)>& job) {
  std::unique_lock lk(mu_);
  job_ = &job;
  pending_ = ranks_;
  error_ = nullptr;
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
  std::exception_ptr err = std::exchange(error_, nullptr);
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

void RankThreads::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(rank);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard lk(mu_);
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace moebatch
