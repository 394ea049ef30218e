#include "engine/cpu/cpu_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "common/error.h"
#include "engine/model_files.h"

namespace moebatch {
namespace {

// Bytes of a rank's fp32 weights as held (lm_head is its own copy even when tied).
int64_t host_bytes(ModelWeights& w) {
  int64_t n =
      static_cast<int64_t>(w.embed.data.size() + w.final_norm.data.size() + w.lm_head.data.size());
  for (LayerWeights& L : w.layers)
    L.zip(L, [&](HostTensor& t, const HostTensor&) { n += static_cast<int64_t>(t.data.size()); });
  return n * static_cast<int64_t>(sizeof(float));
}

}  // namespace

CpuBackend::CpuBackend(const std::filesystem::path& model_dir, const CpuBackendOptions& opts)
    : opts_(opts), comm_(std::max(1, opts.tp)) {
  if (opts.tp < 1 || opts.tp > 64)
    throw InputError("--tp must be in [1, 64], got " + std::to_string(opts.tp));
  if (opts.block_size < 1 || opts.block_size > 1024)
    throw InputError("KV block size must be in [1, 1024]");
  const ModelFiles files = open_model_files(model_dir);  // directory or GGUF file
  cfg_ = files.config;
  const WeightSource& ckpt = *files.weights;
  int threads =
      opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  const int per_rank = std::max(1, threads / opts.tp);
  std::vector<ShardDims> dims;
  for (int r = 0; r < opts.tp; ++r)
    dims.push_back(shard_dims(cfg_, {r, opts.tp, opts.expert_split}));
  // KV of one token on one rank, over the layers that hold KV (fp32)
  const int64_t kv_per_token = cfg_.num_kv_layers() * 2 * dims[0].num_kv_heads * cfg_.head_dim *
                               static_cast<int64_t>(sizeof(float));
  const bool has_state = cfg_.state_bytes_per_seq() > 0;
  if (has_state && (opts.state_slots < 1 || opts.state_slots > 4096))
    throw InputError("state slots (max_num_seqs) must be in [1, 4096]");
  const int64_t bytes_per_block = kv_per_token * opts.block_size * opts.tp;
  // Without any full-attention layer the blocks hold nothing; the scheduler still budgets
  // positions in them, so give every slot room for a whole sequence.
  const int64_t num_blocks =
      bytes_per_block > 0
          ? std::max<int64_t>(1, opts.kv_cache_bytes / bytes_per_block)
          : std::min<int64_t>(
                int64_t{1} << 24,
                opts.state_slots *
                    ((cfg_.max_position_embeddings + opts.block_size - 1) / opts.block_size));
  info_.kv_blocks = num_blocks;
  info_.block_size = opts.block_size;
  info_.kv_bytes_per_token = kv_per_token * opts.tp;
  info_.max_model_len = cfg_.max_position_embeddings;
  info_.state_slots = has_state ? opts.state_slots : 0;
  if (has_state) state_slots_ = StateSlotTracker(opts.state_slots);
  info_.description = fmt::format("cpu tp={}, {} threads/rank, f32 weights", opts.tp, per_rank);
  spdlog::info(
      "cpu backend: {} ({} layers, {} experts), tp={}, {} threads/rank, KV cache {} blocks x {} "
      "tokens ({:.1f} MiB), recurrent state {} slots ({:.1f} MiB)",
      arch_name(cfg_.arch), cfg_.num_layers, cfg_.num_experts, opts.tp, per_rank, num_blocks,
      opts.block_size, num_blocks * bytes_per_block / 1048576.0, info_.state_slots,
      info_.state_slots * cfg_.state_bytes_per_seq() / 1048576.0);
  for (int r = 0; r < opts.tp; ++r) {
    auto rank = std::unique_ptr<CpuRank>(new CpuRank{
        r, dims[r], load_weights(ckpt, cfg_, {r, opts.tp, opts.expert_split}),
        HostKvCache(cfg_.layers, num_blocks, opts.block_size, dims[r].num_kv_heads, cfg_.head_dim),
        std::make_unique<ThreadPool>(per_rank),
        has_state ? std::make_unique<HostLinearState>(cfg_, dims[r], opts.state_slots) : nullptr});
    DeviceUsage u;
    u.device = "cpu";
    u.weight_bytes = host_bytes(rank->weights);
    u.kv_bytes = num_blocks * opts.block_size * kv_per_token;
    u.state_bytes = rank->state ? rank->state->bytes() : 0;
    info_.devices.push_back(u);
    ranks_.push_back(std::move(rank));
  }
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::forward(const StepBatch& batch, std::vector<float>& logits) {
  // Checked before any rank starts: a bad index caught inside one rank thread would leave the
  // others waiting at a barrier.
  validate_step_batch(batch, cfg_, info_.kv_blocks, opts_.block_size);
  if (info_.state_slots > 0) begin_state_step(batch);
  if (ranks_.size() == 1) {
    cpu_forward(cfg_, *ranks_[0], comm_, batch, logits);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<float> unused;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    threads.emplace_back([&, r] { cpu_forward(cfg_, *ranks_[r], comm_, batch, unused); });
  }
  cpu_forward(cfg_, *ranks_[0], comm_, batch, logits);
  for (auto& t : threads) t.join();
}

void CpuBackend::begin_state_step(const StepBatch& b) {
  for (const int32_t s : state_slots_.advance(b))
    for (auto& r : ranks_) r->state->reset(s);
}

}  // namespace moebatch
