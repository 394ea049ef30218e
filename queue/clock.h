// Time source for the queue. The store never reads the system clock directly, so tests and the
// demo can move time (lease expiry, retry backoff) without sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace moebatch {

/// Milliseconds since the Unix epoch, the unit of every timestamp in the jobs table.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Current time in ms since the Unix epoch.
  virtual int64_t now_ms() const = 0;
};

/// Wall-clock time (std::chrono::system_clock), the production choice.
class SystemClock final : public Clock {
 public:
  int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

/// A clock that only moves when told to; thread-safe.
class ManualClock final : public Clock {
 public:
  /// Starts at start_ms.
  explicit ManualClock(int64_t start_ms) : now_(start_ms) {}
  int64_t now_ms() const override { return now_.load(); }
  /// Moves time forward (or back, for tests that need it) by delta_ms.
  void advance(int64_t delta_ms) { now_.fetch_add(delta_ms); }
  /// Sets the absolute time.
  void set(int64_t now_ms) { now_.store(now_ms); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace moebatch
