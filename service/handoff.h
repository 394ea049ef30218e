// A bounded, blocking FIFO between exactly two threads' roles: producers push, consumers pop.
//
// Contract (in the spirit of llama.cpp's server-queue.h):
//  - Every member is thread-safe; all state is guarded by one mutex.
//  - try_push never blocks: it returns false when the queue holds `capacity` items, so the
//    dispatcher (which must never block its io_context) counts free space instead of waiting.
//  - pop_for blocks the consumer up to a timeout; close() wakes every waiter, after which pushes
//    fail and pops drain what is left, then return nothing.
//  - Items keep FIFO order, so the claim order of the job store (priority, then age) is the
//    order the engine sees them in.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

namespace moebatch {

/// Bounded multi-producer multi-consumer FIFO; see the file comment for the contract.
template <typename T>
class Handoff {
 public:
  /// A queue holding at most `capacity` (>= 1) items.
  explicit Handoff(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  /// Appends `item` unless full or closed; never blocks.
  bool try_push(T item) {
    {
      std::lock_guard lock(mu_);
      if (closed_ || items_.size() >= capacity_) return false;
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
    return true;
  }

  /// Inserts `item` before the first queued item `e` with `before(item, e)` (at the back when
  /// there is none), unless full or closed; never blocks. With `before` = "higher priority",
  /// urgent work overtakes what was claimed earlier and equal priorities stay FIFO.
  template <typename Before>
  bool try_push_ordered(T item, Before before) {
    {
      std::lock_guard lock(mu_);
      if (closed_ || items_.size() >= capacity_) return false;
      auto it = items_.begin();
      while (it != items_.end() && !before(item, *it)) ++it;
      items_.insert(it, std::move(item));
    }
    cv_.notify_one();
    return true;
  }

  /// Removes the oldest item, waiting up to `timeout` for one; nullopt on timeout or when
  /// closed and empty.
  std::optional<T> pop_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  /// Removes the oldest item if there is one; never blocks.
  std::optional<T> try_pop() { return pop_for(std::chrono::milliseconds(0)); }

  /// Removes and returns everything queued (shutdown: the caller gives those jobs back).
  std::vector<T> take_all() {
    std::lock_guard lock(mu_);
    std::vector<T> out;
    for (auto& item : items_) out.push_back(std::move(item));
    items_.clear();
    return out;
  }

  /// Removes every queued item for which `pred(item)` is true; returns how many.
  template <typename Pred>
  size_t remove_if(Pred pred) {
    std::lock_guard lock(mu_);
    const size_t before = items_.size();
    std::erase_if(items_, pred);
    return before - items_.size();
  }

  /// Items queued now.
  size_t size() const {
    std::lock_guard lock(mu_);
    return items_.size();
  }

  /// Maximum number of items.
  size_t capacity() const { return capacity_; }

  /// Refuses further pushes and wakes every waiting consumer.
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;
  bool closed_ = false;
};

}  // namespace moebatch
