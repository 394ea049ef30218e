// Engine side of the service. This translation unit includes the engine headers and none of
// the queue's (see service/work.h for why).
#include "service/engine_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "service/gpu_memory.h"

#ifdef MOEBATCH_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace moebatch {
namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Parameters the CPU backend materializes in fp32 (lm_head is a separate copy even when tied).
int64_t weight_bytes_fp32(const ModelConfig& c) {
  const int64_t H = c.hidden_size;
  int64_t n = 2 * c.vocab_size * H + H;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    n += H * c.num_heads * c.head_dim * 2 + H * c.num_kv_heads * c.head_dim * 2 + 2 * H;
    if (c.is_moe_layer(l)) {
      n += c.num_experts * H + c.num_experts * 3 * c.moe_intermediate_size * H;
      n += 3 * c.shared_expert_intermediate_size * H;
    } else {
      n += 3 * c.intermediate_size * H;
    }
  }
  return n * static_cast<int64_t>(sizeof(float));
}

std::string describe(const ModelConfig& mc, const std::string& backend) {
  return std::string(arch_name(mc.arch)) + ", " + std::to_string(mc.num_layers) + " layers, " +
         std::to_string(mc.num_experts) + " experts, hidden " + std::to_string(mc.hidden_size) +
         ", vocab " + std::to_string(mc.vocab_size) + ", " + backend;
}

EngineOptions engine_options(const ServiceConfig& cfg) {
  EngineOptions eo;
  eo.max_num_seqs = cfg.max_num_seqs;
  eo.max_num_batched_tokens = cfg.max_num_batched_tokens;
  return eo;
}

// Fails before any model byte is read when the CUDA engine cannot run here, so a wrong
// `--backend cuda` is a start-up configuration error (exit 2), not an engine death.
void require_cuda() {
  if (!cuda_backend_built()) {
    throw InputError(
        "backend cuda: this build has no CUDA backend (built without nvcc); use --backend cpu");
  }
  std::string why;
  if (cuda_device_count(&why) == 0)
    throw InputError("backend cuda: no CUDA device is visible (" + why + "); use --backend cpu");
}

#ifdef MOEBATCH_HAVE_CUDA
std::unique_ptr<Engine> make_cuda(const ServiceConfig& cfg, EngineInfo& info) {
  CudaBackendOptions o;
  o.gpu_memory_utilization = cfg.gpu_memory_utilization;
  o.max_model_len = cfg.max_model_len;
  // kv_cache_mb caps the KV pool; the memory plan may give it less, never more.
  o.max_kv_cache_bytes = cfg.kv_cache_mb << 20;
  const EngineOptions eo = engine_options(cfg);
  // The backend is built here rather than by make_cuda_engine, with the same capacities that
  // factory derives from the scheduler limits, because the service reads its memory plan (the
  // KV token capacity caps job length at intake and goes into the start log).
  o.max_num_seqs = eo.max_num_seqs;
  o.max_num_batched_tokens = std::max(eo.max_num_batched_tokens, eo.max_num_seqs);
  auto backend = std::make_unique<CudaBackend>(cfg.model, o);
  const ModelConfig& mc = backend->config();
  const MemoryPlan& plan = backend->memory_plan();
  info.vocab_size = mc.vocab_size;
  info.max_context = mc.max_position_embeddings;
  info.kv_tokens = plan.kv_blocks * backend->block_size();
  info.kv_bytes_per_token = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 2;  // bf16
  info.weight_bytes = static_cast<int64_t>(plan.weights);
  info.description = describe(mc, "cuda device 0, gpu_memory_utilization " +
                                      std::to_string(cfg.gpu_memory_utilization).substr(0, 4));
  return std::make_unique<Engine>(std::move(backend), eo);
}
#endif

std::unique_ptr<Engine> make_engine(const ServiceConfig& cfg, EngineInfo& info) {
  if (cfg.backend == "cuda") {
    require_cuda();
#ifdef MOEBATCH_HAVE_CUDA
    return make_cuda(cfg, info);
#endif
  }
  if (cfg.backend != "cpu")
    throw InputError("backend: expected cpu or cuda, got '" + cfg.backend + "'");
  CpuBackendOptions o;
  o.tp = cfg.tp;
  o.threads = cfg.threads;
  o.kv_cache_bytes = cfg.kv_cache_mb << 20;
  auto backend = std::make_unique<CpuBackend>(cfg.model, o);
  const ModelConfig& mc = backend->config();
  info.vocab_size = mc.vocab_size;
  info.max_context = mc.max_position_embeddings;
  info.kv_tokens = backend->num_kv_blocks() * backend->block_size();
  info.kv_bytes_per_token = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 4;
  info.weight_bytes = weight_bytes_fp32(mc);
  info.description = describe(mc, "cpu tp=" + std::to_string(cfg.tp));
  return std::make_unique<Engine>(std::move(backend), engine_options(cfg));
}

}  // namespace

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
  warmup();
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
  EngineInfo info;
  engine_ = make_engine(cfg_, info);
  std::lock_guard lock(mu_);
  info_ = info;
}

// A short batch through every code path (prefill, decode, sampling) so the first real jobs do
// not pay for first-touch allocations; on a GPU backend this is where kernels get tuned and
// graphs captured.
void EngineWorker::warmup() {
  if (cfg_.warmup_seqs <= 0) return;
  const int64_t vocab = engine_->config().vocab_size;
  for (int64_t i = 0; i < cfg_.warmup_seqs; ++i) {
    Request r;
    r.id = static_cast<uint64_t>(i);
    for (int64_t t = 0; t < 8; ++t) r.prompt.push_back(static_cast<int32_t>((i * 8 + t) % vocab));
    r.sampling.max_tokens = 4;
    engine_->add(std::move(r));
  }
  run_to_completion(*engine_);
}

std::vector<WorkResult> EngineWorker::take_results() {
  std::lock_guard lock(mu_);
  std::vector<WorkResult> out;
  out.swap(results_);
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
  r.id = static_cast<uint64_t>(item.job_id);
  r.prompt = std::move(item.prompt);
  r.sampling.temperature = item.temperature;
  r.sampling.top_k = item.top_k;
  r.sampling.top_p = item.top_p;
  r.sampling.seed = item.seed;
  r.sampling.max_tokens = item.max_tokens;
  r.sampling.stop_token_ids = std::move(item.stop_ids);
  try {
    engine_->add(std::move(r));
  } catch (const InputError& e) {
    // The engine's own checks (vocab, context, KV capacity) are the last line: this job fails
    // alone and the batch goes on.
    WorkResult res;
    res.job_id = item.job_id;
    res.outcome = WorkOutcome::Rejected;
    res.error = e.what();
    push_result(std::move(res));
    return;
  }
  active_.push_back({item.job_id, Active{item.claimed, added}});
  counters_.active = static_cast<int64_t>(active_.size());
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

void EngineWorker::step() {
  counters_.occupied_slots +=
      std::min<int64_t>(static_cast<int64_t>(active_.size()), cfg_.max_num_seqs);
  std::vector<FinishedSequence> finished = engine_->step();
  counters_.steps += 1;
  bool any = false;
  for (FinishedSequence& f : finished) {
    const auto id = static_cast<int64_t>(f.id);
    auto it =
        std::find_if(active_.begin(), active_.end(), [&](const auto& a) { return a.first == id; });
    MB_CHECK(it != active_.end(), "engine finished a sequence the worker did not add");
    WorkResult r;
    r.job_id = id;
    r.outcome = WorkOutcome::Finished;
    r.hit_stop_token = f.reason == FinishReason::Stop;
    r.prompt_tokens = f.prompt_tokens;
    r.handoff_s = seconds_between(it->second.claimed, it->second.added);
    r.ttft_s = f.time_to_first_token_s;
    r.total_s = f.total_s;
    counters_.tokens_generated += static_cast<int64_t>(f.tokens.size());
    r.tokens = std::move(f.tokens);
    active_.erase(it);
    push_result(std::move(r));
    any = true;
    std::lock_guard lock(mu_);
    if (command_ != Command::None) ++drained_;
  }
  counters_.active = static_cast<int64_t>(active_.size());
  if (any) notify_();
}

void EngineWorker::abort_active(const std::string& reason) {
  for (auto& [id, a] : active_) {
    WorkResult r;
    r.job_id = id;
    r.outcome = WorkOutcome::Aborted;
    r.error = reason;
    push_result(std::move(r));
  }
  active_.clear();
  counters_.active = 0;
}

std::optional<GpuMemory> EngineWorker::gpu_memory() const {
  if (cfg_.backend != "cuda") return std::nullopt;
  return moebatch::gpu_memory(0);
}

int64_t EngineWorker::memory_in_use() const {
  if (auto g = gpu_memory()) return g->used;
  return process_rss_bytes();
}

void EngineWorker::rebuild(CycleReport& report) {
  report.mem_before = memory_in_use();
  const auto t0 = SteadyClock::now();
  // Destroy first: the old engine's memory (device memory, communicators on a GPU) must be
  // gone before the new one allocates, or a full device could not hold both.
  engine_.reset();
  build_engine();
  const auto t1 = SteadyClock::now();
  warmup();
  const auto t2 = SteadyClock::now();
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
      const bool busy = !engine_->idle();
      if (cmd != Command::None && (!busy || SteadyClock::now() >= deadline)) {
        const auto aborted = static_cast<int64_t>(active_.size());
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
