// Waiting on something another thread or process does, by polling with a deadline.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace moebatch::test {

/// Polls pred every 10 ms until it holds or `timeout` passes; returns pred's last answer (asked
/// once more at the deadline).
inline bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace moebatch::test
