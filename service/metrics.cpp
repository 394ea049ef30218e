#include "service/metrics.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include "service/systemd_notify.h"

namespace moebatch {
namespace {

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

BuildInfo build_info() {
  BuildInfo b;
  b.version = MOEBATCH_VERSION;
  b.backends = MOEBATCH_BACKENDS;
  b.systemd = SystemdNotifier::built_with_systemd();
  return b;
}

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
  std::string out;
  out += "# HELP moebatch_queue_jobs Jobs in the queue database by state.\n";
  out += "# TYPE moebatch_queue_jobs gauge\n";
  for (const auto& [state, n] : in.queue_depth)
    out += fmt::format("moebatch_queue_jobs{{state=\"{}\"}} {}\n", state, n);
  counter(out, "moebatch_jobs_done_total", "Jobs this process completed.", jobs_done_);
  counter(out, "moebatch_jobs_failed_total", "Jobs this process failed for good.", jobs_failed_);
  counter(out, "moebatch_jobs_requeued_total",
          "Claimed jobs given back (shutdown, drain timeout, engine failure).", jobs_requeued_);
  counter(out, "moebatch_prompt_tokens_total",
          "Prompt tokens prefilled, counted at the step that completes each prompt.",
          in.engine_prompt_tokens);
  counter(out, "moebatch_generation_tokens_total",
          "Tokens generated, counted at the step that samples them.", in.engine_tokens);
  counter(out, "moebatch_engine_steps_total", "Engine steps run.", in.engine_steps);
  counter(out, "moebatch_engine_slot_steps_total", "Occupied batch slots summed over engine steps.",
          in.engine_slot_steps);
  gauge(out, "moebatch_engine_slots", "Batch slots (max_num_seqs).",
        static_cast<double>(in.max_num_seqs));
  gauge(out, "moebatch_engine_slots_busy", "Batch slots holding a sequence now.",
        static_cast<double>(in.engine_running));
  gauge(out, "moebatch_engine_slots_usage_ratio", "Busy fraction of the batch slots, 0 to 1.",
        in.max_num_seqs > 0
            ? static_cast<double>(in.engine_running) / static_cast<double>(in.max_num_seqs)
            : 0.0);
  gauge(out, "moebatch_kv_cache_capacity_tokens", "Tokens the KV cache holds.",
        static_cast<double>(in.kv_capacity_tokens));
  gauge(out, "moebatch_kv_cache_capacity_bytes", "KV cache size.",
        static_cast<double>(in.kv_capacity_tokens * in.kv_bytes_per_token));
  gauge(out, "moebatch_kv_cache_used_tokens",
        "KV cache tokens reserved by running sequences (prompt + max_tokens, whole blocks).",
        static_cast<double>(in.kv_reserved_tokens));
  gauge(out, "moebatch_kv_cache_usage_ratio", "Reserved fraction of the KV cache, 0 to 1.",
        in.kv_capacity_tokens > 0 ? static_cast<double>(in.kv_reserved_tokens) /
                                        static_cast<double>(in.kv_capacity_tokens)
                                  : 0.0);
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
  const BuildInfo b = build_info();
  out += fmt::format(
      "# HELP moebatch_build_info The build: version, backends, systemd notifications; always 1.\n"
      "# TYPE moebatch_build_info gauge\n"
      "moebatch_build_info{{version=\"{}\",backends=\"{}\",systemd=\"{}\"}} 1\n",
      b.version, b.backends, b.systemd ? "yes" : "no");
  if (in.process) {
    const ProcessStats& p = *in.process;
    out += fmt::format(
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}\n",
        p.cpu_seconds);
    gauge(out, "process_resident_memory_bytes", "Resident memory size in bytes.",
          static_cast<double>(p.resident_bytes));
    gauge(out, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
          static_cast<double>(p.virtual_bytes));
    gauge(out, "process_open_fds", "Number of open file descriptors.",
          static_cast<double>(p.open_fds));
    if (p.max_fds > 0)
      gauge(out, "process_max_fds", "Maximum number of open file descriptors.",
            static_cast<double>(p.max_fds));
    out += fmt::format(
        "# HELP process_start_time_seconds Start time of the process since unix epoch in "
        "seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {:.2f}\n",
        p.start_time_seconds);
  }
  queue_wait_s_.render("moebatch_queue_wait_seconds", "Enqueue to claim, per completed job.", out);
  ttft_s_.render("moebatch_ttft_seconds", "Claim to first token, per completed job.", out);
  total_s_.render("moebatch_job_total_seconds", "Enqueue to finish, per completed job.", out);
  restart_downtime_s_.render("moebatch_restart_downtime_seconds",
                             "Admission paused per maintenance cycle.", out);
  return out;
}

}  // namespace moebatch
