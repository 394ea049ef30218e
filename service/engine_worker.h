// The engine thread. It owns the Engine (built from the configured backend), takes WorkItems
// from a bounded hand-off in claim order, steps the engine, and reports WorkResults. It also
// runs the engine side of a maintenance cycle (drain, check the model files, rebuild, warmup)
// and of shutdown. A cycle never trades a working engine for a broken one: the model files are
// checked before anything is torn down, and where memory allows (CPU backend, enough available
// RAM) the new engine is built and warmed up beside the old one; a failure there leaves the old
// engine serving and the cycle reported as failed.
//
// Thread-safety: every public member may be called from any thread. The Engine itself is only
// touched by the engine thread after start(). `notify` is called on the engine thread whenever
// results, a cycle report or a state change are ready; it must be cheap and thread-safe (the
// service posts a handler to its io_context).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/device_query.h"
#include "engine/factory.h"
#include "service/config.h"
#include "service/handoff.h"
#include "service/work.h"

namespace moebatch {

class TokenTap;

/// What the engine side of one maintenance cycle did.
struct CycleReport {
  bool ok = false;         ///< rebuilt and warmed up
  std::string error;       ///< why not, when !ok (the old engine still serves)
  int64_t drained = 0;     ///< sequences that finished during the drain
  int64_t aborted = 0;     ///< sequences dropped at the drain deadline (to be requeued)
  int64_t mem_before = 0;  ///< memory_in_use() before destroying the engine, bytes
  int64_t mem_after = 0;   ///< memory_in_use() after rebuild and warmup, bytes
  double drain_s = 0;      ///< drain duration
  double rebuild_s = 0;    ///< destroy + build duration
  double warmup_s = 0;     ///< warmup batch duration
};

/// Engine-thread counters, read by /metrics and the throughput log. Token counters move at
/// every step: a generated token counts at the step that sampled it, a prompt's tokens at the
/// step whose prefill completed (its first generated token).
struct EngineCounters {
  std::atomic<int64_t> steps{0};               ///< engine steps run
  std::atomic<int64_t> occupied_slots{0};      ///< sum over steps of sequences in the batch
  std::atomic<int64_t> tokens_generated{0};    ///< sampled tokens (warmup excluded)
  std::atomic<int64_t> prompt_tokens{0};       ///< prompt tokens prefilled (warmup excluded)
  std::atomic<int64_t> active{0};              ///< sequences inside the engine now
  std::atomic<int64_t> running{0};             ///< of those, sequences holding a slot
  std::atomic<int64_t> kv_reserved_tokens{0};  ///< KV cache tokens the running ones reserve
  std::atomic<int64_t> last_progress_ms{0};    ///< steady-clock ms of the last step or idle wait
};

/// Milliseconds on the steady clock: the time base of EngineCounters::last_progress_ms, so
/// the dispatcher's stall check compares like with like.
int64_t steady_now_ms();

/// Resident set size of this process in bytes (0 when /proc is unavailable).
int64_t process_rss_bytes();

/// The engine thread; see the file comment.
class EngineWorker {
 public:
  /// Builds the engine and runs the warmup batch on the calling thread (errors propagate as
  /// InputError / Error), but does not start the thread yet.
  EngineWorker(const ServiceConfig& cfg, std::function<void()> notify);
  ~EngineWorker();
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  /// Starts the engine thread.
  void start();
  /// The bounded input: the dispatcher try_push()es claimed, tokenized jobs here.
  Handoff<WorkItem>& input() { return input_; }
  /// Stops work on these claims (job cancelled, or its lease lost): a running sequence is
  /// aborted and its slot freed before the next step; one still in the hand-off is dropped.
  /// Nothing is reported for them.
  void cancel(const std::vector<Ticket>& tickets);
  /// Results reported since the last call (finished, rejected or aborted items). With
  /// `progress`, also the tokens streaming jobs (WorkItem::stream) generated since the last
  /// call, in step order, taken under the same lock: every progress report of a run comes out
  /// no later than that run's result, so a rerun never sees its previous run's tokens.
  std::vector<WorkResult> take_results(std::vector<WorkProgress>* progress = nullptr);
  /// Starts a maintenance cycle: stop taking input, finish in-flight sequences until
  /// `drain_timeout`, abort the rest, check the model files, rebuild the engine (beside the
  /// old one where memory allows), warm up, resume; see the file comment.
  void request_maintenance(std::chrono::milliseconds drain_timeout);
  /// The report of a finished maintenance cycle, once.
  std::optional<CycleReport> take_cycle_report();
  /// Stops taking input, finishes in-flight sequences until `drain_timeout`, aborts the rest,
  /// and ends the thread. Items left in input() stay there for the caller to give back.
  void request_stop(std::chrono::milliseconds drain_timeout);
  /// True once the thread has ended (stopped or dead).
  bool finished() const { return finished_.load(); }
  /// Waits for the thread to end.
  void join();
  /// True when the engine failed (exception in a step, or a rebuild after the old engine was
  /// gone): the service must exit.
  bool dead() const { return dead_.load(); }
  /// Why the engine died.
  std::string death_reason() const;
  /// Facts about the current engine (devices, memory, capacities).
  EngineInfo info() const;
  /// Counters for metrics and health.
  const EngineCounters& counters() const { return counters_; }
  /// Memory of each GPU the engine runs on ("cuda:N", used/total); empty with the CPU
  /// backend. Any thread.
  std::vector<std::pair<std::string, GpuMemory>> gpu_memory() const;
  /// The memory a cycle record reports: GPU memory in use with the CUDA backend (what a
  /// rebuild must give back), process RSS otherwise.
  int64_t memory_in_use() const;

 private:
  enum class Command { None, Maintenance, Stop };
  struct Active {
    int64_t job_id = 0;
    std::chrono::steady_clock::time_point claimed, added;
    std::shared_ptr<TokenTap> tap;  // counts every job's tokens; keeps a streaming job's
    int64_t prompt_tokens = 0;      // prompt length
    int64_t kv_tokens = 0;          // KV reserved once running: prompt + max_tokens, in blocks
    int64_t counted = 0;            // generated tokens already in the counters
  };

  void run();
  void build_engine();
  void warmup(Engine& engine);
  bool fits_beside() const;
  bool admit(std::chrono::milliseconds wait);
  void add(WorkItem item);
  std::vector<std::pair<Ticket, Active>>::iterator find_active(Ticket ticket);
  void apply_cancellations();
  void step();
  bool report_progress();
  void count_step_tokens(const std::vector<FinishedSequence>& finished);
  void update_occupancy();
  void abort_active(const std::string& reason);
  void push_result(WorkResult r);
  void rebuild(CycleReport& report);

  ServiceConfig cfg_;
  std::function<void()> notify_;
  Handoff<WorkItem> input_;
  std::unique_ptr<Engine> engine_;                  // engine thread only (after start)
  std::vector<std::pair<Ticket, Active>> active_;  // engine thread only; the engine's ids
  EngineCounters counters_;

  mutable std::mutex mu_;  // guards everything below
  std::vector<WorkResult> results_;
  std::vector<WorkProgress> progress_;
  std::vector<Ticket> cancel_requests_;
  std::optional<CycleReport> cycle_report_;
  Command command_ = Command::None;
  std::chrono::steady_clock::time_point command_deadline_;
  std::chrono::steady_clock::time_point command_started_;
  int64_t drained_ = 0;
  EngineInfo info_;
  std::string death_reason_;

  std::atomic<bool> dead_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace moebatch
