// The long-running service: one Boost.Asio io_context thread (intake from the job store,
// results, lease renewal, maintenance schedule, signals, health/metrics HTTP) and one engine
// thread (EngineWorker), joined by a bounded hand-off.
//
//   store ──claim──▶ prepare_work ──Handoff──▶ engine thread ──results──▶ complete_many ──▶ store
//
// Intake: the io thread polls PRAGMA data_version every poll_ms (external SQL inserts, CLI
// submits), claims at once after wake() (ZeroMQ submits), and at least once a second anyway
// (retry backoffs elapse without any commit). It claims only as many jobs as there is room for
// in the engine's slots plus the hand-off, so no job sits leased behind a full queue.
//
// Results: a finished job's result is kept in memory until the store takes it. When a write
// fails (another connection holds the lock past the short wait the io thread allows itself, or
// the disk is full) it is retried with backoff, intake pauses until every pending result is
// written (so the pending set is bounded by the slots plus the hand-off), and /health reports
// the store unwritable (StoreHealth) without touching it.
//
// Final notices: every job that reaches done, failed or cancelled, whoever made the transition,
// is announced through ServiceHooks::on_final, read from the store's final-transition log
// (ServiceDb::final_events_after) after it committed.
//
// Exit codes of run(): 0 after a graceful stop (SIGTERM/SIGINT/stop()); 3 when the engine thread
// died (the jobs it held are failed as retryable so another run picks them up).
//
// Thread-safety: the constructor and run() belong to one thread; stop(), wake() and
// request_maintenance() may be called from any thread (they post to the io_context).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "queue/clock.h"
#include "queue/job.h"
#include "service/config.h"
#include "service/http_server.h"
#include "service/job_codec.h"
#include "service/metrics.h"
#include "service/restart_schedule.h"
#include "service/service_db.h"
#include "service/systemd_notify.h"
#include "service/work.h"

namespace moebatch {

class EngineWorker;
class JobStore;
class Tokenizer;
struct ApiCall;
struct ApiError;
class BatchStore;
struct BatchRecord;
enum class ApiKind;

/// A job that reached a final state, for the completion notice.
struct FinalNotice {
  int64_t job_id = 0;                     ///< jobs.id
  JobState state = JobState::Done;        ///< Done, Failed or Cancelled
  std::optional<std::string> client_key;  ///< the job's client key
  std::optional<std::string> batch_id;    ///< the job's batch
  std::optional<std::string> error;       ///< failure reason
};

/// Injection points for tests, the demo and the ZeroMQ ingress.
struct ServiceHooks {
  /// Time for the store (leases, timestamps) and the restart schedule.
  std::shared_ptr<const Clock> clock = std::make_shared<SystemClock>();
  /// Called on the io thread, once per job and soon after the commit, when a job reaches done,
  /// failed or cancelled, by this service or anyone else (the ingress publishes it).
  std::function<void(const FinalNotice&)> on_final;
  /// Handle SIGINT/SIGTERM (off when the service is embedded, e.g. in tests or the demo).
  bool handle_signals = true;
};

/// Exit code of run() when the engine thread died.
constexpr int kExitEngineDead = 3;

/// The service; see the file comment.
class Service {
 public:
  /// Loads the tokenizer, opens the store, builds and warms up the engine, binds the HTTP
  /// server, and logs the effective config and memory budget. InputError/Error on bad setup.
  Service(ServiceConfig cfg, ServiceHooks hooks = {});
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  /// Serves until stopped; returns the exit code (see the file comment).
  int run();
  /// Graceful stop, as SIGTERM: stop admitting, give back queued hand-off items, let in-flight
  /// sequences finish until shutdown_timeout_s, give back the rest, return from run().
  void stop();
  /// New jobs were committed (ZeroMQ ingress): claim now instead of at the next poll.
  void wake();
  /// Runs a maintenance cycle now (as `moebatch maintenance --now`).
  void request_maintenance();
  /// The bound health/metrics port (-1 when off).
  int http_port() const;
  /// The bound port of the metrics-only listener (-1 when off).
  int metrics_port() const;
  /// This incarnation's lease owner id (host:pid:start-ms).
  const std::string& worker_id() const { return worker_; }
  /// The io_context the service runs on (the ingress may share it).
  boost::asio::io_context& io() { return io_; }

 private:
  struct Maintenance {
    std::string trigger;
    int64_t started_at = 0;
  };
  // A result the engine reported that the store has not taken yet.
  struct PendingResult {
    int64_t job_id = 0;
    WorkOutcome outcome = WorkOutcome::Finished;
    Completion completion;       // Finished
    std::string error;           // Rejected, Aborted
    std::string param;           // Rejected at intake: the field at fault, for the API's error
    bool count_attempt = false;  // Aborted: fail as retryable (engine died) instead of release
    std::optional<std::string> batch_id;  // for the batch-completion log line
  };
  // Counter values at the last throughput line.
  struct StatsMark {
    int64_t ms = 0, jobs_done = 0, jobs_failed = 0, prompt_tokens = 0, tokens = 0, steps = 0;
  };
  // What a graceful stop did with the jobs it held, for its last log line.
  struct StopTally {
    int64_t not_started = 0;  // hand-off jobs given back at the signal
    int64_t interrupted = 0;  // running past shutdown_timeout_s, given back
    int64_t finished = 0;     // finished during the drain
  };

  // service.cpp: lifecycle, signals, health, maintenance.
  void log_start() const;
  void write_ready_file() const;
  void arm_signals();
  void begin_stop(bool hurry);
  void start_maintenance(const std::string& trigger);
  void finish_maintenance();
  void check_schedule();
  void on_engine_dead();
  void finish_run(int code);
  void add_routes();
  HttpReply health();
  HttpReply metrics();

  // service_ops.cpp: what an operator sees: the throughput line, systemd notifications and
  // the watchdog, batch completions, the end of a graceful stop, the metrics-only listener.
  void start_metrics_listener();
  void arm_stats();
  void log_stats();
  void arm_watchdog();
  std::string status_line() const;
  void note_batch(const std::optional<std::string>& batch_id, bool done);
  void check_batches();
  void log_stop_summary();
  // service_dispatch.cpp: intake, results, leases.
  void arm_poll();
  void poll();
  void claim();
  void on_notify();
  void drain_results();
  bool flush_results();
  void guarded(const char* what, const std::function<void()>& step);
  bool store_write(const char* what, const std::function<void()>& write);
  bool store_read(const char* what, const std::function<void()>& read);
  void store_failed(const char* what, const std::string& error);
  bool result_pending(int64_t job_id) const;
  void publish_finals();
  void prune_finals();
  bool store_refuses(const std::shared_ptr<HttpExchange>& ex);
  bool stop_lost_jobs();
  bool give_up_claims(const std::vector<int64_t>& job_ids);
  void arm_renew();
  int64_t release_handoff();

  // service_api.cpp: the OpenAI-compatible API over the same queue (docs/openai_api.md).
  void api_models(const std::shared_ptr<HttpExchange>& ex);
  void api_generate(ApiKind kind, const std::shared_ptr<HttpExchange>& ex);
  void api_progress(std::vector<WorkProgress>& progress);
  void api_finished(const Completion& c);
  void api_failed(int64_t job_id, const ApiError& e);
  bool api_run_starts(int64_t job_id, const ApiError& e);
  void api_client_gone(int64_t job_id);
  void api_resolve(bool force);
  bool api_resolve_job(int64_t id);
  void api_close_all(const std::string& why);
  bool api_streaming(int64_t job_id) const;

  // service_batches.cpp: the Files and Batch API over the same queue.
  void files_upload(const std::shared_ptr<HttpExchange>& ex);
  void files_list(const std::shared_ptr<HttpExchange>& ex);
  void files_get(const std::shared_ptr<HttpExchange>& ex);
  void files_content(const std::shared_ptr<HttpExchange>& ex);
  /// Writes piece `seq` of file `id` (`piece` when already read; `left` bytes still to send),
  /// then the next one once the socket has taken it; ends the body after the last, cuts it on a
  /// store error.
  void send_file_piece(const std::weak_ptr<HttpExchange>& ex, const std::string& id, int64_t seq,
                       int64_t left, std::optional<std::string> piece);
  void files_delete(const std::shared_ptr<HttpExchange>& ex);
  void batches_create(const std::shared_ptr<HttpExchange>& ex);
  void batches_get(const std::shared_ptr<HttpExchange>& ex);
  void batches_list(const std::shared_ptr<HttpExchange>& ex);
  void batches_cancel(const std::shared_ptr<HttpExchange>& ex);
  void batches_tick(bool force);
  void batch_validate(const BatchRecord& b);
  void batch_finalize(const BatchRecord& b);

  ServiceConfig cfg_;
  ServiceHooks hooks_;
  std::string worker_;
  boost::asio::io_context io_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<ServiceDb> service_db_;
  std::unique_ptr<BatchStore> batches_;
  std::unique_ptr<EngineWorker> worker_engine_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<HttpServer> metrics_http_;  // --metrics-port: /metrics and /health only
  boost::asio::steady_timer poll_timer_, renew_timer_, stats_timer_, watchdog_timer_;
  SystemdNotifier notifier_;
  std::optional<boost::asio::signal_set> signals_;
  RestartSchedule schedule_;
  std::optional<int64_t> next_restart_ms_;
  IntakeLimits limits_;
  ServiceMetrics metrics_;

  // io-thread state.
  std::map<int64_t, InFlightJob> in_flight_;  // claimed and not yet reported
  Ticket last_ticket_ = 0;                    // the newest claim's WorkItem::ticket
  std::vector<PendingResult> pending_;        // reported, not yet in the store
  StoreHealth store_health_;
  int64_t final_seq_ = 0;  // the last final event announced
  int64_t last_prune_ms_ = 0;
  int64_t last_read_warn_ms_ = -1;   // store_read logs a failure at most every 10 s
  int64_t give_up_results_ms_ = -1;  // stopping: pending results are dropped after this
  bool admitting_ = true;
  bool stopping_ = false;
  bool claim_now_ = true;
  int64_t last_data_version_ = -1;
  int64_t last_forced_claim_ms_ = 0;
  std::optional<Maintenance> maintenance_;
  int exit_code_ = 0;
  bool done_ = false;
  StatsMark stats_mark_;
  StopTally stop_tally_;
  // Batches with results in this process, checked for completion every few seconds: jobs done
  // and failed here, by batch id.
  std::map<std::string, std::pair<int64_t, int64_t>> batch_results_;
  std::set<std::string> batches_to_check_;
  int64_t last_batch_check_ms_ = 0;
  // /metrics' jobs per state, at most once a second from the store: the count scans the job
  // table, and /metrics answers anyone who asks.
  std::map<std::string, int64_t> queue_depth_;
  int64_t queue_depth_ms_ = -1;

  // OpenAI API state (io thread): one entry per open request, by job id.
  std::map<int64_t, std::unique_ptr<ApiCall>> api_calls_;
  std::string served_model_;
  int64_t last_api_resolve_ms_ = 0;
  int64_t last_batch_tick_ms_ = 0;
  // Open batches whose last step threw, logged already: one line per batch, not one per tick.
  std::set<std::string> batches_in_trouble_;
};

}  // namespace moebatch
