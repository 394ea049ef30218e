// Service metrics in the Prometheus text exposition format (version 0.0.4). Owned and updated
// by the io_context thread only (the dispatcher records, the HTTP handler renders), so it needs
// no locking; engine-thread counters are atomics read at render time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "service/process_stats.h"

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
  int64_t engine_tokens = 0;                   ///< tokens generated so far (per step)
  int64_t engine_prompt_tokens = 0;            ///< prompt tokens prefilled so far (per step)
  int64_t engine_active = 0;                   ///< sequences in the engine now
  int64_t engine_running = 0;                  ///< of those, sequences holding a slot
  int64_t max_num_seqs = 1;                    ///< slots
  int64_t kv_reserved_tokens = 0;              ///< KV cache tokens reserved by running ones
  int64_t kv_capacity_tokens = 0;              ///< KV cache tokens in all
  int64_t kv_bytes_per_token = 0;              ///< KV bytes of one token (all layers, ranks)
  int64_t in_flight = 0;                       ///< claimed, not yet reported
  bool engine_alive = true;                    ///< engine thread healthy
  int64_t http_open_connections = 0;           ///< HTTP connections open now
  int64_t api_open_requests = 0;               ///< OpenAI API requests not answered yet
  int64_t http_accept_failures = 0;            ///< HTTP accepts that failed (EMFILE, ...)
  bool store_writable = true;                  ///< the job store takes writes (StoreHealth)
  int64_t store_write_failures = 0;            ///< store writes that failed so far
  int64_t results_pending = 0;                 ///< results kept until the store takes them
  std::optional<ProcessStats> process;         ///< process_* metrics (absent without /proc)
  /// Memory of one GPU the engine runs on.
  struct Gpu {
    std::string device;  ///< "cuda:N"
    int64_t used = 0;    ///< bytes in use, every process together
    int64_t total = 0;   ///< device memory
  };
  std::vector<Gpu> gpus;  ///< one per GPU of the engine; empty with the CPU backend
};

/// Build facts for moebatch_build_info.
struct BuildInfo {
  std::string version;   ///< moebatch version
  std::string backends;  ///< "cpu" or "cpu,cuda"
  bool systemd = false;  ///< built with libsystemd notifications
};

/// The build this binary is.
BuildInfo build_info();

/// Counters and histograms of one service. Rates are left to the scraper (rate() over the
/// counters); nothing here averages over time.
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

 public:
  /// Jobs done so far (the throughput log reads it).
  int64_t jobs_done() const { return jobs_done_; }
  /// Jobs failed for good so far.
  int64_t jobs_failed() const { return jobs_failed_; }
};

}  // namespace moebatch
