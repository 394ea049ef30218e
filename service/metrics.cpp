#include "service/metrics.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

namespace moebatch {
namespace {

constexpr int64_t kRateWindowMs = 10000;

const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   30,  60,   300};

void gauge(std::string& out, const std::string& name, const std::string& help, double v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
}

void counter(std::string& out, const std::string& name, const std::string& help, int64_t v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
}

std::string format_bound(double b) { return fmt::format("{}", b); }

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, format_bound(bounds_[i]), cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cumulative,
                     name, sum_, name, count_);
}

ServiceMetrics::ServiceMetrics()
    : queue_wait_s_(kLatencyBounds),
      ttft_s_(kLatencyBounds),
      total_s_(kLatencyBounds),
      restart_downtime_s_({1, 5, 10, 30, 60, 120, 300, 600}) {}

void ServiceMetrics::job_done(double queue_wait_s, double ttft_s, double total_s, int64_t tokens) {
  ++jobs_done_;
  tokens_done_ += tokens;
  queue_wait_s_.observe(queue_wait_s);
  ttft_s_.observe(ttft_s);
  total_s_.observe(total_s);
}

void ServiceMetrics::restart(bool ok, double downtime_s) {
  (ok ? restarts_ok_ : restarts_failed_) += 1;
  restart_downtime_s_.observe(downtime_s);
}

std::string ServiceMetrics::render(const MetricsInputs& in) {
  window_.push_back(
      {in.now_ms, jobs_done_, in.engine_tokens, in.engine_steps, in.engine_slot_steps});
  while (window_.size() > 2 && in.now_ms - window_[1].ms >= kRateWindowMs) window_.pop_front();
  const Sample& a = window_.front();
  const Sample& b = window_.back();
  const double dt = std::max<int64_t>(1, b.ms - a.ms) / 1000.0;
  const double jobs_rate = window_.size() > 1 ? (b.jobs - a.jobs) / dt : 0.0;
  const double tokens_rate = window_.size() > 1 ? (b.tokens - a.tokens) / dt : 0.0;
  const int64_t dsteps = b.steps - a.steps;
  const double occupancy =
      dsteps > 0 ? static_cast<double>(b.slot_steps - a.slot_steps) /
                       static_cast<double>(dsteps * std::max<int64_t>(1, in.max_num_seqs))
                 : 0.0;

  std::string out;
  out += "# HELP moebatch_queue_jobs Jobs in the queue database by state.\n";
  out += "# TYPE moebatch_queue_jobs gauge\n";
  for (const auto& [state, n] : in.queue_depth)
    out += fmt::format("moebatch_queue_jobs{{state=\"{}\"}} {}\n", state, n);
  counter(out, "moebatch_jobs_done_total", "Jobs this process completed.", jobs_done_);
  counter(out, "moebatch_jobs_failed_total", "Jobs this process failed for good.", jobs_failed_);
  counter(out, "moebatch_jobs_requeued_total",
          "Claimed jobs given back (shutdown, drain timeout, engine failure).", jobs_requeued_);
  counter(out, "moebatch_tokens_generated_total", "Tokens the engine generated.", in.engine_tokens);
  counter(out, "moebatch_engine_steps_total", "Engine steps run.", in.engine_steps);
  counter(out, "moebatch_engine_slot_steps_total", "Occupied batch slots summed over engine steps.",
          in.engine_slot_steps);
  gauge(out, "moebatch_jobs_per_second", "Jobs completed per second over the last ~10 s.",
        jobs_rate);
  gauge(out, "moebatch_tokens_per_second", "Tokens generated per second over the last ~10 s.",
        tokens_rate);
  gauge(out, "moebatch_batch_occupancy",
        "Occupied fraction of the batch slots per step over the last ~10 s.", occupancy);
  gauge(out, "moebatch_engine_active_sequences", "Sequences inside the engine now.",
        static_cast<double>(in.engine_active));
  gauge(out, "moebatch_in_flight_jobs", "Jobs claimed and not yet reported.",
        static_cast<double>(in.in_flight));
  gauge(out, "moebatch_engine_up", "1 while the engine thread is alive.", in.engine_alive ? 1 : 0);
  gauge(out, "moebatch_http_open_connections", "HTTP connections open now.",
        static_cast<double>(in.http_open_connections));
  gauge(out, "moebatch_api_open_requests",
        "OpenAI API requests waiting for or streaming their result.",
        static_cast<double>(in.api_open_requests));
  counter(out, "moebatch_http_accept_failures_total",
          "HTTP accepts that failed (out of descriptors, ...); the listener backs off.",
          in.http_accept_failures);
  gauge(out, "moebatch_store_writable",
        "1 while the job store takes writes; 0 when it has refused them (locked past "
        "store_busy_timeout_ms, disk full): intake paused, results kept.",
        in.store_writable ? 1 : 0);
  counter(out, "moebatch_store_write_failures_total",
          "Job store writes that failed (each is retried).", in.store_write_failures);
  gauge(out, "moebatch_results_pending",
        "Finished results kept in memory until the job store takes them.",
        static_cast<double>(in.results_pending));
  // Only with the CUDA backend: a CPU service has no device memory, and a zero would read as
  // an empty GPU on a dashboard.
  if (!in.gpus.empty()) {
    out +=
        "# HELP moebatch_gpu_memory_used_bytes Device memory in use (all processes), from "
        "cudaMemGetInfo.\n# TYPE moebatch_gpu_memory_used_bytes gauge\n";
    for (const auto& g : in.gpus)
      out += fmt::format("moebatch_gpu_memory_used_bytes{{device=\"{}\"}} {}\n", g.device, g.used);
    out +=
        "# HELP moebatch_gpu_memory_total_bytes Device memory.\n"
        "# TYPE moebatch_gpu_memory_total_bytes gauge\n";
    for (const auto& g : in.gpus)
      out +=
          fmt::format("moebatch_gpu_memory_total_bytes{{device=\"{}\"}} {}\n", g.device, g.total);
  }
  out += "# HELP moebatch_restarts_total Maintenance cycles by result.\n";
  out += "# TYPE moebatch_restarts_total counter\n";
  out += fmt::format("moebatch_restarts_total{{result=\"ok\"}} {}\n", restarts_ok_);
  out += fmt::format("moebatch_restarts_total{{result=\"failed\"}} {}\n", restarts_failed_);
  queue_wait_s_.render("moebatch_queue_wait_seconds", "Enqueue to claim, per completed job.", out);
  ttft_s_.render("moebatch_ttft_seconds", "Claim to first token, per completed job.", out);
  total_s_.render("moebatch_job_total_seconds", "Enqueue to finish, per completed job.", out);
  restart_downtime_s_.render("moebatch_restart_downtime_seconds",
                             "Admission paused per maintenance cycle.", out);
  return out;
}

}  // namespace moebatch
