// Service lifecycle: construction and start log, signals, graceful stop, engine death, the
// maintenance cycle, and /health + /metrics. Intake and results are in service_dispatch.cpp.
#include "service/service.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <csignal>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_parse.h"
#include "engine/tokenizer/tokenizer.h"
#include "queue/batch_store.h"
#include "queue/job_store.h"
#include "queue/store_url.h"
#include "service/api_call.h"
#include "service/engine_worker.h"
#include "service/http_server.h"
#include "service/load_progress.h"
#include "service/openai_api.h"
#include "service/process_stats.h"
#include "service/service_db.h"

namespace moebatch {
namespace {

std::string make_worker_id(int64_t now_ms) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + std::to_string(now_ms);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

// The longest the io thread waits for another writer's lock in one store call. The same thread
// serves HTTP, so a long wait would stall /health and every stream; a refused write is kept and
// tried again instead (StoreHealth), and store_busy_timeout_ms decides when the store counts
// as unwritable.
constexpr int64_t kStoreLockWaitMs = 200;

// Every connection holds a descriptor, and so do the store, the ZeroMQ sockets and the
// engine's files: HTTP connections get at most half the process's limit, so a flood of them is
// refused with 503 while the rest of the daemon still has descriptors to work with.
size_t http_connection_cap(int64_t configured) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return static_cast<size_t>(configured);
  const auto half = std::max<int64_t>(8, static_cast<int64_t>(rl.rlim_cur / 2));
  if (configured <= half) return static_cast<size_t>(configured);
  spdlog::warn(
      "http_max_connections {} is more than half the descriptor limit ({}): capped at {} (raise "
      "the limit, e.g. LimitNOFILE in the systemd unit)",
      configured, static_cast<int64_t>(rl.rlim_cur), half);
  return static_cast<size_t>(half);
}

}  // namespace

Service::Service(ServiceConfig cfg, ServiceHooks hooks)
    : cfg_(std::move(cfg)),
      hooks_(std::move(hooks)),
      worker_(make_worker_id(hooks_.clock->now_ms())),
      poll_timer_(io_),
      renew_timer_(io_),
      stats_timer_(io_),
      watchdog_timer_(io_),
      schedule_(RestartSchedule::parse(cfg_.restart_at)),
      store_health_(cfg_.store_busy_timeout_ms) {
  validate_config(cfg_);
  const std::string tok_dir = cfg_.tokenizer.empty() ? cfg_.model : cfg_.tokenizer;
  // Parsing tokenizer.json and building the engine are independent and each takes a good part
  // of start-up, so they overlap: a restarted daemon is back sooner. An engine error wins; the
  // future's destructor then waits for the tokenizer thread.
  auto tokenizer = std::async(std::launch::async, [tok_dir] {
    return std::make_unique<Tokenizer>(Tokenizer::from_model(tok_dir));
  });

  prepare_store_location(cfg_.db);  // the SQLite file's directory
  const std::filesystem::path db_path(cfg_.db);
  StoreOptions so;
  so.path = db_path;
  so.synchronous = cfg_.synchronous == "full" ? Synchronous::Full : Synchronous::Normal;
  so.clock = hooks_.clock;
  // Opened first with the usual lock wait, for a migration that may queue behind another
  // process; then for good with the io thread's short one.
  { JobStore migrated(so); }
  const auto lock_wait =
      std::chrono::milliseconds(std::min(kStoreLockWaitMs, cfg_.store_busy_timeout_ms));
  so.busy_timeout = lock_wait;
  store_ = std::make_unique<JobStore>(so);
  service_db_ = std::make_unique<ServiceDb>(db_path, lock_wait, /*final_log=*/true);
  final_seq_ = service_db_->last_final_event();
  batches_ = std::make_unique<BatchStore>(db_path);

  // The engine thread reports through the io_context, never by touching io-thread state.
  notifier_.status("loading the model");
  {
    LoadProgress progress(cfg_.model);
    worker_engine_ = std::make_unique<EngineWorker>(cfg_, [this] {
      boost::asio::post(io_, [this] { guarded("results", [this] { on_notify(); }); });
    });
    progress.done();
  }
  tokenizer_ = tokenizer.get();
  const EngineInfo info = worker_engine_->info();
  limits_.vocab_size = info.vocab_size;
  limits_.max_prompt_tokens = cfg_.max_prompt_tokens;
  limits_.max_model_len = info.max_context;
  if (cfg_.max_model_len > 0)
    limits_.max_model_len = std::min(limits_.max_model_len, cfg_.max_model_len);
  // A sequence reserves KV for prompt + max_tokens up front, so one longer than the whole
  // cache could never be admitted: refuse it at intake with a reason instead.
  limits_.max_model_len = std::min(limits_.max_model_len, info.backend.kv_tokens());
  if (tokenizer_->vocab_size() > static_cast<size_t>(info.vocab_size)) {
    spdlog::warn("tokenizer has {} ids but the model only {}: prompts using the extra ids fail",
                 tokenizer_->vocab_size(), info.vocab_size);
  }
  served_model_ = cfg_.served_model_name;
  if (served_model_.empty())
    served_model_ = std::filesystem::path(cfg_.model).lexically_normal().filename().string();
  if (served_model_.empty()) served_model_ = "model";
  if (cfg_.http_port >= 0) {
    std::vector<std::string> keys;
    if (!cfg_.api_key_file.empty()) {
      keys = load_api_keys(cfg_.api_key_file);
      namespace fs = std::filesystem;
      const auto perms = fs::status(cfg_.api_key_file).permissions();
      if ((perms & (fs::perms::group_all | fs::perms::others_all)) != fs::perms::none)
        spdlog::warn("api_key_file {} is readable by other users (chmod 600 it)",
                     cfg_.api_key_file);
    }
    HttpLimits hl;
    hl.max_connections = http_connection_cap(cfg_.http_max_connections);
    hl.max_connections_per_address = static_cast<size_t>(cfg_.http_max_connections_per_address);
    hl.min_send_rate = static_cast<uint64_t>(cfg_.http_min_send_kib_s) << 10;
    http_ = std::make_unique<HttpServer>(io_, cfg_.http_host, cfg_.http_port, hl);
    http_->set_api_keys(std::move(keys));
    add_routes();
  }
  start_metrics_listener();
  log_start();
}

Service::~Service() {
  if (worker_engine_) {
    worker_engine_->request_stop(std::chrono::milliseconds(0));
    worker_engine_->join();
  }
}

int Service::http_port() const { return http_ ? http_->port() : -1; }

int Service::metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }

void Service::log_start() const {
  const EngineInfo info = worker_engine_->info();
  nlohmann::json shown = config_to_json(cfg_);
  shown["db"] = store_location_for_display(cfg_.db);  // a URL's password stays out of logs
  spdlog::info("moebatch service {} starting; effective config: {}", worker_, dump_json(shown));
  spdlog::info("engine: {}; {}", info.model, info.backend.description);
  for (const DeviceUsage& d : info.backend.devices) {
    spdlog::info(
        "memory on {}: weights {:.1f} MiB (as held), KV cache {:.1f} MiB, step buffers "
        "{:.1f} MiB{}",
        d.device, mib(d.weight_bytes), mib(d.kv_bytes), mib(d.activation_bytes),
        d.total_bytes ? fmt::format(" of {:.1f} MiB", mib(d.total_bytes)) : "");
  }
  spdlog::info(
      "KV {} bytes/token, KV cache holds {} tokens, {} slots; jobs are capped at {} tokens "
      "(prompt + max_tokens)",
      info.backend.kv_bytes_per_token, info.backend.kv_tokens(), cfg_.max_num_seqs,
      limits_.max_model_len);
  spdlog::info("restart schedule: {}", schedule_.enabled() ? schedule_.spec() : "off");
  if (cfg_.http_port >= 0) {
    spdlog::info("OpenAI API on http://{}:{}/v1 (model '{}'): {}", cfg_.http_host, http_->port(),
                 served_model_,
                 cfg_.api_key_file.empty()
                     ? "no --api-key-file, so no authentication: listening on loopback only"
                     : "bearer keys from " + cfg_.api_key_file);
  }
}

void Service::write_ready_file() const {
  if (cfg_.ready_file.empty()) return;
  nlohmann::json j{{"pid", getpid()},
                   {"worker", worker_},
                   {"http_port", http_port()},
                   {"metrics_port", metrics_port()},
                   {"db", cfg_.db}};
  // Write then rename, so a reader never sees half a file.
  const std::string tmp = cfg_.ready_file + ".tmp";
  {
    std::ofstream out(tmp);
    out << dump_json(j) << "\n";
    if (!out) throw Error("cannot write ready file " + tmp);
  }
  std::filesystem::rename(tmp, cfg_.ready_file);
}

int Service::run() {
  worker_engine_->start();
  if (http_) http_->start();
  if (metrics_http_) metrics_http_->start();
  if (hooks_.handle_signals) {
    signals_.emplace(io_, SIGINT, SIGTERM);
    arm_signals();
  }
  last_prune_ms_ = steady_now_ms();  // the first prune a minute in, not during start-up
  next_restart_ms_ = schedule_.next_after(hooks_.clock->now_ms());
  if (next_restart_ms_) {
    spdlog::info("next maintenance cycle in {:.1f} s ({})",
                 (*next_restart_ms_ - hooks_.clock->now_ms()) / 1000.0, schedule_.spec());
  }
  arm_poll();
  arm_renew();
  write_ready_file();
  spdlog::info("serving: db {}, http {}", store_location_for_display(cfg_.db),
               http_ ? cfg_.http_host + ":" + std::to_string(http_->port()) : "off");
  if (const auto p = read_process_stats()) {
    const double since_start =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
        p->start_time_seconds;
    spdlog::info("ready {:.2f} s after the process started", since_start);
  }
  notifier_.ready(status_line());
  arm_stats();
  arm_watchdog();
  io_.run();
  worker_engine_->join();
  spdlog::info("service stopped (exit code {})", exit_code_);
  return exit_code_;
}

void Service::stop() {
  boost::asio::post(io_, [this] { begin_stop(false); });
}

void Service::wake() {
  boost::asio::post(io_, [this] {
    claim_now_ = true;
    guarded("intake", [this] { claim(); });
  });
}

void Service::request_maintenance() {
  boost::asio::post(io_, [this] { start_maintenance("request"); });
}

void Service::arm_signals() {
  signals_->async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;  // operation_aborted: the signal set was cancelled at exit
    spdlog::info("signal {}: {}", sig, stopping_ ? "stopping now" : "draining, then stopping");
    begin_stop(/*hurry=*/stopping_);
    arm_signals();
  });
}

// Graceful stop: nothing new is taken; jobs waiting in the hand-off never started and go back
// at once; in-flight sequences get shutdown_timeout_s to finish, the rest go back. A second
// signal cuts the wait short.
void Service::begin_stop(bool hurry) {
  if (done_) return;
  if (stopping_) {
    if (hurry) {
      worker_engine_->request_stop(std::chrono::milliseconds(0));
      give_up_results_ms_ = steady_now_ms();
    }
    return;
  }
  stopping_ = true;
  admitting_ = false;
  notifier_.stopping(fmt::format("draining {} running job(s) for up to {} s",
                                 worker_engine_->counters().active.load(),
                                 cfg_.shutdown_timeout_s));
  // Results the store refuses are retried until the drain time is over, and a little longer
  // for those that finish at its very end.
  give_up_results_ms_ = steady_now_ms() + cfg_.shutdown_timeout_s * 1000 + 2000;
  stop_tally_.not_started += release_handoff();
  spdlog::info(
      "stopping: {} job(s) that had not started went back to the queue; {} running job(s) get "
      "up to {} s to finish, then go back too",
      stop_tally_.not_started, worker_engine_->counters().active.load(), cfg_.shutdown_timeout_s);
  // API requests whose job has not started will not run here any more: answer them now. Those
  // in the engine get the drain time like every job.
  std::vector<int64_t> waiting;
  for (const auto& [id, call] : api_calls_)
    if (!in_flight_.count(id) && !result_pending(id)) waiting.push_back(id);
  for (int64_t id : waiting) {
    store_write("cancelling an API job", [&] { store_->cancel(id); });
    api_failed(id, {503, "the server is shutting down", "", "shutting_down", "server_error"});
  }
  worker_engine_->request_stop(std::chrono::seconds(cfg_.shutdown_timeout_s));
}

void Service::finish_run(int code) {
  if (done_) return;
  api_close_all("the server is shutting down");
  done_ = true;
  exit_code_ = code;
  poll_timer_.cancel();
  renew_timer_.cancel();
  stats_timer_.cancel();
  watchdog_timer_.cancel();
  if (http_) http_->stop();
  if (metrics_http_) metrics_http_->stop();
  if (signals_) signals_->cancel();
  io_.stop();
}

void Service::on_engine_dead() {
  spdlog::error("engine thread is dead ({}); giving jobs back and exiting with code {}",
                worker_engine_->death_reason(), kExitEngineDead);
  drain_results();
  release_handoff();
  if (!pending_.empty()) {
    spdlog::error(
        "{} result(s) the store did not take ({}); those jobs run again once their "
        "leases expire",
        pending_.size(), store_health_.last_error());
  }
  finish_run(kExitEngineDead);
}

void Service::start_maintenance(const std::string& trigger) {
  if (maintenance_ || stopping_ || done_ || worker_engine_->dead()) return;
  spdlog::info("maintenance ({}): stop admitting, drain up to {} s, rebuild, warm up", trigger,
               cfg_.drain_timeout_s);
  admitting_ = false;
  maintenance_ = Maintenance{trigger, hooks_.clock->now_ms()};
  notifier_.status("maintenance (" + trigger + "): draining, then rebuilding the engine");
  worker_engine_->request_maintenance(std::chrono::seconds(cfg_.drain_timeout_s));
}

void Service::finish_maintenance() {
  std::optional<CycleReport> report = worker_engine_->take_cycle_report();
  if (!report || !maintenance_) return;
  CycleRecord rec;
  rec.worker = worker_;
  rec.trigger = maintenance_->trigger;
  rec.started_at = maintenance_->started_at;
  rec.ended_at = hooks_.clock->now_ms();
  rec.downtime_ms = std::max<int64_t>(0, rec.ended_at - rec.started_at);
  rec.drained = report->drained;
  rec.requeued = report->aborted;
  rec.mem_before = report->mem_before;
  rec.mem_after = report->mem_after;
  rec.warmup_ms = static_cast<int64_t>(report->warmup_s * 1000.0);
  rec.result = report->ok ? "ok" : "failed";
  rec.error = report->error;
  if (!store_write("recording the maintenance cycle", [&] { service_db_->record_cycle(rec); }))
    spdlog::error("maintenance: the cycle was not recorded (the store refuses writes)");
  metrics_.restart(report->ok, rec.downtime_ms / 1000.0);
  spdlog::info(
      "maintenance {} ({}): downtime {} ms (drain {:.2f} s, rebuild {:.2f} s, warmup {} ms), "
      "drained {}, requeued {}, {} {:.1f} -> {:.1f} MiB{}",
      rec.result, rec.trigger, rec.downtime_ms, report->drain_s, report->rebuild_s, rec.warmup_ms,
      rec.drained, rec.requeued, cfg_.backend == "cuda" ? "GPU memory" : "RSS", mib(rec.mem_before),
      mib(rec.mem_after), report->ok ? "" : ": " + rec.error);
  maintenance_.reset();
  if (!stopping_) admitting_ = true;
  claim_now_ = true;
  notifier_.status(status_line());
}

void Service::check_schedule() {
  if (!next_restart_ms_) return;
  const int64_t now = hooks_.clock->now_ms();
  if (now < *next_restart_ms_) return;
  next_restart_ms_ = schedule_.next_after(now);
  start_maintenance("schedule");
}

// Answers from memory only: the engine's counters and StoreHealth, never the store, so it is
// as fast with the store locked or the disk full as at any other time.
HttpReply Service::health() {
  nlohmann::json j{{"worker", worker_},
                   {"in_flight", in_flight_.size()},
                   {"pending_results", pending_.size()},
                   {"active", worker_engine_->counters().active.load()}};
  if (worker_engine_->dead() || done_) {
    j["status"] = "dead";
    j["reason"] = worker_engine_->death_reason();
    return {503, "application/json", dump_json(j) + "\n"};
  }
  const int64_t idle_ms = steady_now_ms() - worker_engine_->counters().last_progress_ms.load();
  if (idle_ms > cfg_.health_stall_s * 1000) {
    j["status"] = "stalled";
    j["reason"] = "engine thread made no progress for " + std::to_string(idle_ms) + " ms";
    return {503, "application/json", dump_json(j) + "\n"};
  }
  if (store_health_.unwritable(steady_now_ms())) {
    j["status"] = "store_unwritable";
    j["reason"] = "the job store refuses writes (" +
                  std::to_string(store_health_.failures_in_a_row()) +
                  " failed in a row; intake paused, results kept): " + store_health_.last_error();
    return {503, "application/json", dump_json(j) + "\n"};
  }
  if (stopping_) {
    j["status"] = "stopping";
    return {503, "application/json", dump_json(j) + "\n"};
  }
  // Maintenance is planned downtime of a live process: healthy, just not admitting.
  j["status"] = maintenance_ ? "maintenance" : "ok";
  return {200, "application/json", dump_json(j) + "\n"};
}

void Service::add_routes() {
  // JSON endpoints take bodies up to 1 MiB plus envelope (a prompt is at most 1 MiB).
  constexpr size_t kJsonBodyLimit = (1 << 20) + (64 << 10);
  http_->route({"GET", "/health", 0, false, [this](const auto& ex) { ex->reply(health()); }});
  http_->route({"GET", "/metrics", 0, false, [this](const auto& ex) { ex->reply(metrics()); }});
  http_->route({"GET", "/v1/models", 0, true, [this](const auto& ex) { api_models(ex); }});
  http_->route({"GET", "/v1/models/*", 0, true, [this](const auto& ex) { api_models(ex); }});
  http_->route({"POST", "/v1/chat/completions", kJsonBodyLimit, true,
                [this](const auto& ex) { api_generate(ApiKind::Chat, ex); }});
  http_->route({"POST", "/v1/completions", kJsonBodyLimit, true,
                [this](const auto& ex) { api_generate(ApiKind::Completion, ex); }});
  // Files and batches (service_batches.cpp): uploads up to 16 MiB.
  constexpr size_t kFileBodyLimit = 16 << 20;
  http_->route(
      {"POST", "/v1/files", kFileBodyLimit, true, [this](const auto& ex) { files_upload(ex); }});
  http_->route({"GET", "/v1/files", 0, true, [this](const auto& ex) { files_list(ex); }});
  http_->route({"GET", "/v1/files/*", 0, true, [this](const auto& ex) { files_get(ex); }});
  http_->route(
      {"GET", "/v1/files/*/content", 0, true, [this](const auto& ex) { files_content(ex); }});
  http_->route({"DELETE", "/v1/files/*", 0, true, [this](const auto& ex) { files_delete(ex); }});
  http_->route({"POST", "/v1/batches", kJsonBodyLimit, true,
                [this](const auto& ex) { batches_create(ex); }});
  http_->route({"GET", "/v1/batches", 0, true, [this](const auto& ex) { batches_list(ex); }});
  http_->route({"GET", "/v1/batches/*", 0, true, [this](const auto& ex) { batches_get(ex); }});
  http_->route(
      {"POST", "/v1/batches/*/cancel", 1024, true, [this](const auto& ex) { batches_cancel(ex); }});
}

HttpReply Service::metrics() {
  MetricsInputs in;
  if (const int64_t now = steady_now_ms(); queue_depth_ms_ < 0 || now - queue_depth_ms_ >= 1000) {
    try {
      queue_depth_ = service_db_->job_counts();
      queue_depth_ms_ = now;
    } catch (const std::exception& e) {
      spdlog::warn("metrics: queue depth unavailable: {}", e.what());
      queue_depth_.clear();
    }
  }
  in.queue_depth = queue_depth_;
  const EngineCounters& c = worker_engine_->counters();
  in.engine_steps = c.steps.load();
  in.engine_slot_steps = c.occupied_slots.load();
  in.engine_tokens = c.tokens_generated.load();
  in.engine_prompt_tokens = c.prompt_tokens.load();
  in.engine_active = c.active.load();
  in.engine_running = c.running.load();
  in.max_num_seqs = cfg_.max_num_seqs;
  const EngineInfo info = worker_engine_->info();
  in.kv_reserved_tokens = c.kv_reserved_tokens.load();
  in.kv_capacity_tokens = info.backend.kv_tokens();
  in.kv_bytes_per_token = info.backend.kv_bytes_per_token;
  in.in_flight = static_cast<int64_t>(in_flight_.size());
  in.engine_alive = !worker_engine_->dead();
  in.process = read_process_stats();
  for (const auto& [device, g] : worker_engine_->gpu_memory())
    in.gpus.push_back({device, g.used, g.total});
  in.http_open_connections = http_ ? static_cast<int64_t>(http_->counters().open) : 0;
  in.http_accept_failures = http_ ? http_->counters().accept_failures : 0;
  in.store_writable = !store_health_.unwritable(steady_now_ms());
  in.store_write_failures = store_health_.failures();
  in.results_pending = static_cast<int64_t>(pending_.size());
  in.api_open_requests = static_cast<int64_t>(api_calls_.size());
  return {200, "text/plain; version=0.0.4", metrics_.render(in)};
}

}  // namespace moebatch
