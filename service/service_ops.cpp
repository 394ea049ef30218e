// What an operator sees of a running service besides /health and /metrics: the throughput log
// line (vLLM's habit: every log_stats_interval_s while there is work, silent when idle), the
// systemd notifications and watchdog pings (service/systemd_notify.h), a line when a batch has
// no job left to run, the summary of a graceful stop, and the optional metrics-only listener.
#include <spdlog/spdlog.h>

#include "queue/job_store.h"
#include "service/engine_worker.h"
#include "service/service.h"

namespace moebatch {
namespace {

// Batches are looked at for completion at most this often (one indexed query each).
constexpr int64_t kBatchCheckMs = 2000;

double per_second(int64_t delta, int64_t ms) {
  return ms > 0 ? static_cast<double>(delta) * 1000.0 / static_cast<double>(ms) : 0.0;
}

}  // namespace

void Service::start_metrics_listener() {
  if (cfg_.metrics_port < 0) return;
  HttpLimits limits;
  limits.max_connections = 64;
  metrics_http_ = std::make_unique<HttpServer>(io_, cfg_.metrics_host, cfg_.metrics_port, limits);
  metrics_http_->route(
      {"GET", "/metrics", 0, false, [this](const auto& ex) { ex->reply(metrics()); }});
  metrics_http_->route(
      {"GET", "/health", 0, false, [this](const auto& ex) { ex->reply(health()); }});
  if (!is_loopback_host(cfg_.metrics_host)) {
    spdlog::warn(
        "metrics listener on {}:{} is beyond loopback: anyone who reaches it can read /metrics "
        "and /health (no authentication; the API is not served there)",
        cfg_.metrics_host, metrics_http_->port());
  } else {
    spdlog::info("metrics listener on {}:{} (/metrics, /health)", cfg_.metrics_host,
                 metrics_http_->port());
  }
}

std::string Service::status_line() const {
  const EngineCounters& c = worker_engine_->counters();
  return fmt::format("serving: {}/{} slots busy, {} job(s) done, {} failed", c.running.load(),
                     cfg_.max_num_seqs, metrics_.jobs_done(), metrics_.jobs_failed());
}

void Service::arm_stats() {
  const EngineCounters& c = worker_engine_->counters();
  stats_mark_ = {steady_now_ms(),        metrics_.jobs_done(),      metrics_.jobs_failed(),
                 c.prompt_tokens.load(), c.tokens_generated.load(), c.steps.load()};
  if (cfg_.log_stats_interval_s <= 0) return;
  stats_timer_.expires_after(std::chrono::seconds(cfg_.log_stats_interval_s));
  stats_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || done_) return;
    log_stats();
    arm_stats();
  });
}

void Service::log_stats() {
  const EngineCounters& c = worker_engine_->counters();
  const StatsMark& m = stats_mark_;
  const int64_t ms = steady_now_ms() - m.ms;
  const int64_t done = metrics_.jobs_done() - m.jobs_done;
  const int64_t failed = metrics_.jobs_failed() - m.jobs_failed;
  const int64_t prompt = c.prompt_tokens.load() - m.prompt_tokens;
  const int64_t generated = c.tokens_generated.load() - m.tokens;
  const int64_t steps = c.steps.load() - m.steps;
  const int64_t running = c.running.load();
  // Silent when idle: nothing happened in the interval and nothing is held.
  if (done == 0 && failed == 0 && steps == 0 && running == 0 && in_flight_.empty()) {
    notifier_.status(status_line());
    return;
  }
  const int64_t kv_capacity = worker_engine_->info().backend.kv_tokens();
  const double kv_pct = kv_capacity > 0 ? 100.0 * static_cast<double>(c.kv_reserved_tokens.load()) /
                                              static_cast<double>(kv_capacity)
                                        : 0.0;
  const auto waiting = static_cast<int64_t>(worker_engine_->input().size());
  spdlog::info(
      "throughput: {} job(s) done, {} failed ({:.2f} jobs/s); prompt {:.1f} tok/s, generation "
      "{:.1f} tok/s; slots {}/{} busy; KV cache {:.1f}% reserved; {} waiting in the hand-off",
      done, failed, per_second(done, ms), per_second(prompt, ms), per_second(generated, ms),
      running, cfg_.max_num_seqs, kv_pct, waiting);
  notifier_.status(
      fmt::format("{}; generation {:.1f} tok/s", status_line(), per_second(generated, ms)));
}

// Pings while the io thread runs and the engine thread makes progress: a step stuck for
// health_stall_s (a hung device) stops the pings and systemd restarts the process. A
// maintenance cycle's rebuild may take long and is not a stall.
void Service::arm_watchdog() {
  const auto every = notifier_.watchdog_interval();
  if (!every) return;
  const int64_t idle_ms = steady_now_ms() - worker_engine_->counters().last_progress_ms.load();
  const bool stalled = !maintenance_ && idle_ms > cfg_.health_stall_s * 1000;
  if (!stalled && !worker_engine_->dead()) {
    notifier_.watchdog();
  } else {
    spdlog::warn("watchdog: no ping, the engine thread made no progress for {} ms", idle_ms);
  }
  watchdog_timer_.expires_after(*every);
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || done_) return;
    arm_watchdog();
  });
}

void Service::note_batch(const std::optional<std::string>& batch_id, bool done) {
  if (!batch_id) return;
  auto& [ok, failed] = batch_results_[*batch_id];
  ++(done ? ok : failed);
  batches_to_check_.insert(*batch_id);
}

// A batch with results here is complete once no job of it is queued or running; a batch that
// other workers finish is not this process's to announce.
void Service::check_batches() {
  const int64_t now = steady_now_ms();
  if (batches_to_check_.empty() || now - last_batch_check_ms_ < kBatchCheckMs) return;
  last_batch_check_ms_ = now;
  std::set<std::string> check;
  check.swap(batches_to_check_);
  for (const std::string& id : check) {
    try {
      bool open = false;
      for (JobState state : {JobState::Queued, JobState::Running}) {
        ListFilter f;
        f.batch_id = id;
        f.state = state;
        f.limit = 1;
        open = open || !store_->list(f).empty();
      }
      if (open) continue;
    } catch (const std::exception& e) {
      batches_to_check_.insert(id);  // the store is busy: look again later
      continue;
    }
    const auto [ok, failed] = batch_results_[id];
    spdlog::info("batch '{}' complete: no job left queued or running ({} done and {} failed here)",
                 id, ok, failed);
    batch_results_.erase(id);
  }
}

void Service::log_stop_summary() {
  const StopTally& t = stop_tally_;
  spdlog::info(
      "stopped: {} job(s) went back to the queue ({} not started, {} still running after "
      "shutdown_timeout_s {} s); {} finished during the drain",
      t.not_started + t.interrupted, t.not_started, t.interrupted, cfg_.shutdown_timeout_s,
      t.finished);
}

}  // namespace moebatch
