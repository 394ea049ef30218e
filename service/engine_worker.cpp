// Engine side of the service. This translation unit includes the engine headers and none of
// the queue's (see service/work.h for why).
#include "service/engine_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "engine/device_query.h"
#include "engine/engine.h"
#include "engine/factory.h"
#include "engine/model_files.h"

namespace moebatch {
namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The engine this service configuration asks for.
EngineSpec engine_spec(const ServiceConfig& cfg) {
  EngineSpec spec;
  spec.model = cfg.model;
  spec.backend = cfg.backend;
  spec.tensor_parallel_size = cfg.tp;
  spec.expert_split = cfg.enable_expert_parallel ? ExpertSplit::Expert : ExpertSplit::Intermediate;
  spec.collective_timeout_s = static_cast<double>(cfg.collective_timeout_s);
  spec.custom_all_reduce = !cfg.disable_custom_all_reduce;
  spec.quantization = parse_quantization(cfg.quantization);
  spec.threads = cfg.threads;
  // CPU: the KV pool's size; CUDA: a cap, the memory plan may give it less, never more
  // (0: the factory's default, 256 MiB on cpu, no cap on cuda).
  spec.kv_cache_bytes = cfg.kv_cache_mb << 20;
  spec.gpu_memory_utilization = cfg.gpu_memory_utilization;
  spec.max_model_len = cfg.max_model_len;
  spec.scheduler.max_num_seqs = cfg.max_num_seqs;
  spec.scheduler.max_num_batched_tokens = cfg.max_num_batched_tokens;
  return spec;
}

// Opens the model the rebuild will read, headers and extents only (config.json, every tensor's
// dtype, shape and offsets inside its file): a truncated or missing file, or a broken config,
// is found while the old engine still serves. Random-weight models have no files.
void check_model_files(const std::string& model) {
  if (model.rfind("random:", 0) == 0) return;
  open_model_files(model);
}

// MemAvailable from /proc/meminfo: what the kernel could give without swapping (0 if unknown).
int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ss(line.substr(13));
    int64_t kb = 0;
    ss >> kb;
    return kb * 1024;
  }
  return 0;
}

}  // namespace

/// Every job's stop-string watcher: the engine feeds it every generated token but the stop
/// token, at the step that made it, so it counts them for the per-step token counters, keeps
/// a streaming job's for the next progress report, and passes each on to the job's own watcher
/// (if any). Engine thread only.
class TokenTap final : public StopStrings {
 public:
  TokenTap(std::shared_ptr<StopStrings> inner, bool keep) : inner_(std::move(inner)), keep_(keep) {}
  bool push(int32_t token) override {
    ++seen;
    if (keep_) fresh.push_back(token);
    return inner_ && inner_->push(token);
  }
  std::vector<int32_t> fresh;  ///< streaming: tokens not reported yet
  int64_t seen = 0;            ///< tokens pushed so far

 private:
  std::shared_ptr<StopStrings> inner_;
  bool keep_;
};

int64_t process_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream ss(line.substr(6));
    int64_t kb = 0;
    ss >> kb;
    return kb * 1024;
  }
  return 0;
}

EngineWorker::EngineWorker(const ServiceConfig& cfg, std::function<void()> notify)
    : cfg_(cfg), notify_(std::move(notify)), input_(static_cast<size_t>(cfg.max_num_seqs)) {
  build_engine();
  warmup(*engine_);
  counters_.last_progress_ms = steady_now_ms();
}

EngineWorker::~EngineWorker() {
  if (thread_.joinable()) {
    request_stop(std::chrono::milliseconds(0));
    thread_.join();
  }
}

void EngineWorker::start() {
  thread_ = std::thread([this] { run(); });
}

void EngineWorker::join() {
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::build_engine() {
  BuiltEngine built = make_engine(engine_spec(cfg_));
  engine_ = std::move(built.engine);
  std::lock_guard lock(mu_);
  info_ = std::move(built.info);
}

// A short batch through every code path (prefill, decode, sampling) so the first real jobs do
// not pay for first-touch allocations; on a GPU backend this is where kernels get tuned and
// graphs captured.
void EngineWorker::warmup(Engine& engine) {
  if (cfg_.warmup_seqs <= 0) return;
  const int64_t vocab = engine.config().vocab_size;
  for (int64_t i = 0; i < cfg_.warmup_seqs; ++i) {
    Request r;
    r.id = static_cast<uint64_t>(i);
    for (int64_t t = 0; t < 8; ++t) r.prompt.push_back(static_cast<int32_t>((i * 8 + t) % vocab));
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 4;
    engine.add(std::move(r));
  }
  run_to_completion(engine);
}

std::vector<WorkResult> EngineWorker::take_results(std::vector<WorkProgress>* progress) {
  std::lock_guard lock(mu_);
  std::vector<WorkResult> out;
  out.swap(results_);
  if (progress) {
    progress->clear();
    progress->swap(progress_);
  }
  return out;
}

void EngineWorker::request_maintenance(std::chrono::milliseconds drain_timeout) {
  std::lock_guard lock(mu_);
  if (command_ != Command::None) return;
  command_ = Command::Maintenance;
  command_started_ = SteadyClock::now();
  command_deadline_ = command_started_ + drain_timeout;
  drained_ = 0;
}

std::optional<CycleReport> EngineWorker::take_cycle_report() {
  std::lock_guard lock(mu_);
  std::optional<CycleReport> r;
  r.swap(cycle_report_);
  return r;
}

void EngineWorker::request_stop(std::chrono::milliseconds drain_timeout) {
  std::lock_guard lock(mu_);
  // Stop overrides a maintenance cycle in progress; a second stop may shorten the deadline.
  const auto deadline = SteadyClock::now() + drain_timeout;
  if (command_ == Command::Stop) {
    command_deadline_ = std::min(command_deadline_, deadline);
    return;
  }
  command_ = Command::Stop;
  command_started_ = SteadyClock::now();
  command_deadline_ = deadline;
}

std::string EngineWorker::death_reason() const {
  std::lock_guard lock(mu_);
  return death_reason_;
}

EngineInfo EngineWorker::info() const {
  std::lock_guard lock(mu_);
  return info_;
}

void EngineWorker::push_result(WorkResult r) {
  {
    std::lock_guard lock(mu_);
    results_.push_back(std::move(r));
  }
}

void EngineWorker::add(WorkItem item) {
  const auto added = SteadyClock::now();
  Request r;
  r.id = item.ticket;
  r.prompt = std::move(item.prompt);
  r.sampling.temperature = item.temperature;
  r.sampling.top_k = item.top_k;
  r.sampling.top_p = item.top_p;
  r.sampling.seed = item.seed;
  r.sampling.max_tokens = item.max_tokens;
  r.sampling.stop_token_ids = std::move(item.stop_ids);
  const auto prompt_tokens = static_cast<int64_t>(r.prompt.size());
  const int64_t block = std::max<int64_t>(1, engine_->backend_info().block_size);
  const int64_t kv_tokens = (prompt_tokens + item.max_tokens + block - 1) / block * block;
  auto tap = std::make_shared<TokenTap>(std::move(item.stop_strings), item.stream);
  r.stop_strings = tap;
  try {
    engine_->add(std::move(r));
  } catch (const InputError& e) {
    // The engine's own checks (vocab, context, KV capacity) are the last line: this job fails
    // alone and the batch goes on.
    WorkResult res;
    res.job_id = item.job_id;
    res.ticket = item.ticket;
    res.outcome = WorkOutcome::Rejected;
    res.error = e.what();
    push_result(std::move(res));
    return;
  }
  active_.push_back({item.ticket, Active{item.job_id, item.claimed, added, std::move(tap),
                                         prompt_tokens, kv_tokens, 0}});
  update_occupancy();
}

std::vector<std::pair<Ticket, EngineWorker::Active>>::iterator EngineWorker::find_active(
    Ticket ticket) {
  return std::find_if(active_.begin(), active_.end(),
                      [&](const auto& a) { return a.first == ticket; });
}

// The engine admits its waiting sequences first come, first served, and active_ keeps the
// order they were added in, so the ones holding slots (and their KV reservations) are the
// first num_running() of active_.
void EngineWorker::update_occupancy() {
  const auto running = engine_ ? std::min(engine_->num_running(), active_.size()) : size_t{0};
  int64_t kv = 0;
  for (size_t i = 0; i < running; ++i) kv += active_[i].second.kv_tokens;
  counters_.active = static_cast<int64_t>(active_.size());
  counters_.running = static_cast<int64_t>(running);
  counters_.kv_reserved_tokens = kv;
}

// Adds this step's tokens to the counters: the finished sequences' last tokens (a stop token
// never reaches the tap) and every running sequence's new ones; a prompt counts once, at the
// step of its sequence's first token.
void EngineWorker::count_step_tokens(const std::vector<FinishedSequence>& finished) {
  int64_t generated = 0, prompt = 0;
  for (const FinishedSequence& f : finished) {
    const auto it = find_active(f.id);
    if (it == active_.end()) continue;
    if (it->second.counted == 0) prompt += f.prompt_tokens;
    generated += static_cast<int64_t>(f.tokens.size()) - it->second.counted;
  }
  for (auto& entry : active_) {
    // Not a structured binding: clang before 16 cannot capture one in a lambda.
    const Ticket ticket = entry.first;
    auto& a = entry.second;
    if (a.tap->seen <= a.counted) continue;
    if (std::none_of(finished.begin(), finished.end(),
                     [&](const FinishedSequence& f) { return f.id == ticket; })) {
      if (a.counted == 0) prompt += a.prompt_tokens;
      generated += a.tap->seen - a.counted;
      a.counted = a.tap->seen;
    }
  }
  counters_.tokens_generated += generated;
  counters_.prompt_tokens += prompt;
}

// Pulls work from the hand-off according to the batching mode; true when something was added.
bool EngineWorker::admit(std::chrono::milliseconds wait) {
  const auto slots = static_cast<size_t>(cfg_.max_num_seqs);
  bool added = false;
  if (cfg_.batching == BatchingMode::Static) {
    // Static: a new batch only when the previous one is completely done, and only once it is
    // full (or the fill wait ran out with at least one sequence).
    if (!active_.empty()) return false;
    auto first = input_.pop_for(wait);
    if (!first) return false;
    std::vector<WorkItem> batch;
    batch.push_back(std::move(*first));
    const auto fill_deadline =
        SteadyClock::now() + std::chrono::milliseconds(cfg_.static_batch_wait_ms);
    while (batch.size() < slots) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(fill_deadline - SteadyClock::now());
      if (left.count() <= 0) break;
      auto next = input_.pop_for(left);
      if (!next) break;
      batch.push_back(std::move(*next));
    }
    for (auto& item : batch) add(std::move(item));
    return true;
  }
  // Continuous: top up every free slot now; block only when the engine has nothing to do.
  while (active_.size() < slots) {
    auto item = active_.empty() && !added ? input_.pop_for(wait) : input_.try_pop();
    if (!item) break;
    add(std::move(*item));
    added = true;
  }
  return added;
}

void EngineWorker::cancel(const std::vector<Ticket>& tickets) {
  if (tickets.empty()) return;
  // First out of the hand-off, then the request to the engine thread: an item the engine
  // thread popped before the removal is active by the time it reads the request (it adds what
  // it pops before it looks at requests again), so every cancelled job is caught one way.
  input_.remove_if([&](const WorkItem& w) {
    return std::find(tickets.begin(), tickets.end(), w.ticket) != tickets.end();
  });
  std::lock_guard lock(mu_);
  cancel_requests_.insert(cancel_requests_.end(), tickets.begin(), tickets.end());
}

// Aborts the sequences of cancelled jobs, freeing their slots and KV for the next step.
void EngineWorker::apply_cancellations() {
  std::vector<Ticket> tickets;
  {
    std::lock_guard lock(mu_);
    tickets.swap(cancel_requests_);
  }
  for (Ticket t : tickets) {
    const auto it = find_active(t);
    if (it == active_.end()) continue;  // already finished, or never reached the engine
    engine_->abort(t);
    active_.erase(it);
  }
  update_occupancy();
}

void EngineWorker::step() {
  counters_.occupied_slots +=
      std::min<int64_t>(static_cast<int64_t>(active_.size()), cfg_.max_num_seqs);
  std::vector<FinishedSequence> finished = engine_->step();
  counters_.steps += 1;
  count_step_tokens(finished);
  bool any = false;
  for (FinishedSequence& f : finished) {
    const auto it = find_active(f.id);
    MB_CHECK(it != active_.end(), "engine finished a sequence the worker did not add");
    WorkResult r;
    r.job_id = it->second.job_id;
    r.ticket = f.id;
    r.outcome = WorkOutcome::Finished;
    r.hit_stop_token = f.reason == FinishReason::StopToken;
    r.hit_stop_string = f.reason == FinishReason::StopString;
    r.prompt_tokens = f.prompt_tokens;
    r.handoff_s = seconds_between(it->second.claimed, it->second.added);
    r.ttft_s = f.time_to_first_token_s;
    r.total_s = f.total_s;
    r.tokens = std::move(f.tokens);
    active_.erase(it);
    push_result(std::move(r));
    any = true;
    std::lock_guard lock(mu_);
    if (command_ != Command::None) ++drained_;
  }
  update_occupancy();
  if (report_progress() || any) notify_();
}

// Moves the tokens streaming sequences made in this step to the progress list; true when there
// were any. Finished sequences are reported by their result instead (it holds every token).
bool EngineWorker::report_progress() {
  std::vector<WorkProgress> fresh;
  for (auto& [ticket, a] : active_) {
    if (a.tap->fresh.empty()) continue;
    fresh.push_back({a.job_id, ticket, std::move(a.tap->fresh)});
    a.tap->fresh.clear();
  }
  if (fresh.empty()) return false;
  std::lock_guard lock(mu_);
  for (auto& p : fresh) progress_.push_back(std::move(p));
  return true;
}

void EngineWorker::abort_active(const std::string& reason) {
  for (auto& [ticket, a] : active_) {
    WorkResult r;
    r.job_id = a.job_id;
    r.ticket = ticket;
    r.outcome = WorkOutcome::Aborted;
    r.error = reason;
    push_result(std::move(r));
  }
  active_.clear();
  update_occupancy();
}

std::vector<std::pair<std::string, GpuMemory>> EngineWorker::gpu_memory() const {
  std::vector<std::pair<std::string, GpuMemory>> out;
  for (const DeviceUsage& d : info().backend.devices) {
    if (d.device.rfind("cuda:", 0) != 0) continue;
    if (auto g = moebatch::gpu_memory(std::stoi(d.device.substr(5))))
      out.emplace_back(d.device, *g);
  }
  return out;
}

int64_t EngineWorker::memory_in_use() const {
  const auto gpus = gpu_memory();
  if (gpus.empty()) return process_rss_bytes();
  int64_t used = 0;
  for (const auto& [name, g] : gpus) used += g.used;
  return used;
}

// A second engine beside the running one: CPU only (a GPU's memory plan gives one engine
// gpu_memory_utilization of the device, so two never fit), and only when the memory the kernel
// reports available holds another copy of everything this engine holds, with a quarter spare.
bool EngineWorker::fits_beside() const {
  if (cfg_.backend != "cpu") return false;
  int64_t need = 0;
  for (const DeviceUsage& d : info().backend.devices)
    need += d.weight_bytes + d.kv_bytes + d.state_bytes + d.activation_bytes;
  return need > 0 && available_memory_bytes() > need + need / 4;
}

// Returns with report.ok = false, the old engine untouched, when the model files are broken or
// the side-by-side build fails; throws (the engine is gone) only when the rebuild after the
// teardown fails.
void EngineWorker::rebuild(CycleReport& report) {
  report.mem_before = memory_in_use();
  const auto t0 = SteadyClock::now();
  try {
    check_model_files(cfg_.model);
  } catch (const std::exception& e) {
    report.error = std::string("model check failed; the old engine keeps serving: ") + e.what();
    report.mem_after = memory_in_use();
    return;
  }
  SteadyClock::time_point t1, t2;
  if (fits_beside()) {
    try {
      BuiltEngine built = make_engine(engine_spec(cfg_));
      t1 = SteadyClock::now();
      warmup(*built.engine);
      t2 = SteadyClock::now();
      engine_ = std::move(built.engine);  // the old engine goes only now
      std::lock_guard lock(mu_);
      info_ = std::move(built.info);
    } catch (const std::exception& e) {
      report.error = std::string("rebuild failed; the old engine keeps serving: ") + e.what();
      report.mem_after = memory_in_use();
      return;
    }
  } else {
    // Destroy first: the old engine's memory (device memory, communicators on a GPU) must be
    // gone before the new one allocates, or a full device could not hold both.
    engine_.reset();
    build_engine();
    t1 = SteadyClock::now();
    warmup(*engine_);
    t2 = SteadyClock::now();
  }
  report.rebuild_s = seconds_between(t0, t1);
  report.warmup_s = seconds_between(t1, t2);
  report.mem_after = memory_in_use();
  report.ok = true;
}

void EngineWorker::run() {
  try {
    while (true) {
      counters_.last_progress_ms = steady_now_ms();
      Command cmd;
      SteadyClock::time_point deadline, started;
      {
        std::lock_guard lock(mu_);
        cmd = command_;
        deadline = command_deadline_;
        started = command_started_;
      }
      if (cmd == Command::None) admit(std::chrono::milliseconds(50));
      apply_cancellations();
      const bool busy = !engine_->idle();
      if (cmd != Command::None && (!busy || SteadyClock::now() >= deadline)) {
        const auto aborted = static_cast<int64_t>(active_.size());
        // Out of the engine too: a maintenance cycle whose rebuild fails keeps serving on it.
        for (const auto& entry : active_) engine_->abort(entry.first);
        abort_active(cmd == Command::Stop ? "shutdown" : "maintenance drain timeout");
        if (cmd == Command::Stop) break;
        CycleReport report;
        report.aborted = aborted;
        report.drain_s = seconds_between(started, SteadyClock::now());
        {
          std::lock_guard lock(mu_);
          report.drained = drained_;
        }
        notify_();
        try {
          rebuild(report);
        } catch (const std::exception& e) {
          report.ok = false;
          report.error = e.what();
          std::lock_guard lock(mu_);
          cycle_report_ = report;
          command_ = Command::None;
          throw;
        }
        std::lock_guard lock(mu_);
        cycle_report_ = report;
        if (command_ == Command::Maintenance) command_ = Command::None;
        continue;
      }
      if (busy) {
        step();
      } else if (cmd != Command::None) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(mu_);
      death_reason_ = e.what();
    }
    spdlog::error("engine thread failed: {}", e.what());
    abort_active(std::string("engine failure: ") + e.what());
    engine_.reset();
    dead_ = true;
  }
  finished_ = true;
  notify_();
}

int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

}  // namespace moebatch
