// Service metrics in the Prometheus text exposition format (version 0.0.4). Owned and updated
// by the io_context thread only (the dispatcher records, the HTTP handler renders), so it needs
// no locking; engine-thread counters are atomics read at render time.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moebatch {

/// A cumulative histogram with fixed upper bounds (seconds or fractions).
class Histogram {
 public:
  /// Buckets with these increasing upper bounds (+Inf is implicit).
  explicit Histogram(std::vector<double> bounds);
  /// Adds one observation.
  void observe(double v);
  /// Appends the # HELP/# TYPE lines and the _bucket/_sum/_count series.
  void render(const std::string& name, const std::string& help, std::string& out) const;
  /// Observations so far.
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; +Inf last
  double sum_ = 0;
  int64_t count_ = 0;
};

/// Values read from outside the metrics object at render time.
struct MetricsInputs {
  std::map<std::string, int64_t> queue_depth;  ///< jobs per state
  int64_t engine_steps = 0;                    ///< engine steps so far
  int64_t engine_slot_steps = 0;               ///< sum of occupied slots over steps
  int64_t engine_tokens = 0;                   ///< tokens generated so far
  int64_t engine_active = 0;                   ///< sequences in the engine now
  int64_t max_num_seqs = 1;                    ///< slots
  int64_t in_flight = 0;                       ///< claimed, not yet reported
  bool engine_alive = true;                    ///< engine thread healthy
  int64_t http_open_connections = 0;           ///< HTTP connections open now
  int64_t api_open_requests = 0;               ///< OpenAI API requests not answered yet
  int64_t http_accept_failures = 0;            ///< HTTP accepts that failed (EMFILE, ...)
  bool store_writable = true;                  ///< the job store takes writes (StoreHealth)
  int64_t store_write_failures = 0;            ///< store writes that failed so far
  int64_t results_pending = 0;                 ///< results kept until the store takes them
  int64_t now_ms = 0;                          ///< steady-clock ms, for rates
  /// Memory of one GPU the engine runs on.
  struct Gpu {
    std::string device;  ///< "cuda:N"
    int64_t used = 0;    ///< bytes in use, every process together
    int64_t total = 0;   ///< device memory
  };
  std::vector<Gpu> gpus;  ///< one per GPU of the engine; empty with the CPU backend
};

/// Counters and histograms of one service.
class ServiceMetrics {
 public:
  ServiceMetrics();
  /// A job committed done, with its latency in seconds and its generated tokens.
  void job_done(double queue_wait_s, double ttft_s, double total_s, int64_t tokens);
  /// A job failed for good (bad input, or engine rejection).
  void job_failed() { ++jobs_failed_; }
  /// Jobs given back to the queue (shutdown, drain timeout, engine failure).
  void jobs_requeued(int64_t n) { jobs_requeued_ += n; }
  /// A maintenance cycle ended; `ok` tells how.
  void restart(bool ok, double downtime_s);
  /// Prometheus text for everything above plus `in`.
  std::string render(const MetricsInputs& in);

 private:
  int64_t jobs_done_ = 0, jobs_failed_ = 0, jobs_requeued_ = 0, tokens_done_ = 0;
  int64_t restarts_ok_ = 0, restarts_failed_ = 0;
  Histogram queue_wait_s_, ttft_s_, total_s_, restart_downtime_s_;
  // Rate window: (steady ms, jobs done, tokens generated, steps, slot-steps) samples taken at
  // each render, kept for ~10 s, so jobs/s, tokens/s and occupancy are recent averages.
  struct Sample {
    int64_t ms, jobs, tokens, steps, slot_steps;
  };
  std::deque<Sample> window_;
};

}  // namespace moebatch
