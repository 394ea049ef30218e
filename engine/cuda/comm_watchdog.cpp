#include "engine/cuda/comm_watchdog.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/error.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;

// Poll often enough that a short (test) timeout fires close to its deadline, rarely enough that
// a long one costs nothing: timeout / 20, within [10, 100] ms.
milliseconds poll_interval(double timeout_s) {
  const auto ms = static_cast<int64_t>(timeout_s * 1000.0 / 20.0);
  return milliseconds(std::clamp<int64_t>(ms, 10, 100));
}

// Checked before the thread starts (a throwing constructor must not leave a joinable thread).
int checked_world(int world, double timeout_s) {
  MB_CHECK(world >= 1 && timeout_s > 0, "CommWatchdog: need ranks and a positive timeout");
  return world;
}

}  // namespace

CommWatchdog::CommWatchdog(AbortableComm& comm, int world, double timeout_s)
    : comm_(comm),
      world_(checked_world(world, timeout_s)),
      timeout_s_(timeout_s),
      poll_(poll_interval(timeout_s)),
      progress_(std::make_unique<std::atomic<int>[]>(static_cast<size_t>(world))),
      thread_([this] { loop(); }) {}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void CommWatchdog::begin_step() {
  for (int r = 0; r < world_; ++r) progress_[r].store(0, std::memory_order_relaxed);
  std::lock_guard lk(mu_);
  active_ = true;
  started_ = std::chrono::steady_clock::now();
}

std::string CommWatchdog::end_step() {
  std::lock_guard lk(mu_);
  active_ = false;
  return failure_;
}

void CommWatchdog::trip(int rank, const std::string& what) {
  {
    std::lock_guard lk(mu_);
    if (fired_ || !trip_.empty()) return;
    trip_ = fmt::format("rank {} failed mid-step: {}", rank, what);
  }
  cv_.notify_one();
}

bool CommWatchdog::fired() const {
  std::lock_guard lk(mu_);
  return fired_;
}

std::string CommWatchdog::abort_reason() const {
  std::lock_guard lk(mu_);
  return reason_;
}

// The rank that made the least progress is the one the others wait for (a stalled host thread
// never reaches its launches); with a device-side hang every rank reaches the same point and
// the lowest rank is named.
std::string CommWatchdog::timeout_message() const {
  int stuck = 0;
  std::string marks;
  for (int r = 0; r < world_; ++r) {
    const int p = progress_[r].load(std::memory_order_relaxed);
    if (p < progress_[stuck].load(std::memory_order_relaxed)) stuck = r;
    marks += (r ? ", " : "") + std::to_string(p);
  }
  return fmt::format(
      "collective timeout after {:g} s on rank {} (step progress per rank: {}); "
      "communicators aborted",
      timeout_s_, stuck, marks);
}

void CommWatchdog::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, poll_, [&] { return stop_ || !trip_.empty(); });
    if (stop_) return;
    std::string reason;
    bool own = false;  // the watchdog's own finding (not a rank's trip)
    if (!trip_.empty()) {
      reason = trip_;
    } else if (active_) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - started_;
      if (elapsed.count() > timeout_s_) {
        reason = timeout_message();
        own = true;
      } else {
        lk.unlock();
        std::string err = comm_.async_error();  // no lock: it may take a moment per rank
        lk.lock();
        if (stop_) return;
        if (!err.empty()) {
          reason = err + "; communicators aborted";
          own = true;
        }
      }
    }
    if (reason.empty()) continue;
    fired_ = true;
    reason_ = reason;
    if (own) failure_ = reason;
    lk.unlock();
    spdlog::error("collective watchdog: {}", reason);
    comm_.abort(reason);  // may wait here until the ranks' graphs are destroyed
    return;
  }
}

}  // namespace moebatch
