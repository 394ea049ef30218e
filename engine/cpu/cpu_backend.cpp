#include "engine/cpu/cpu_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <thread>

#include "common/error.h"
#include "engine/safetensors.h"

namespace moebatch {

CpuBackend::CpuBackend(const std::filesystem::path& model_dir, const CpuBackendOptions& opts)
    : cfg_(load_model_config(model_dir)), opts_(opts), comm_(std::max(1, opts.tp)) {
  if (opts.tp < 1 || opts.tp > 64)
    throw InputError("--tp must be in [1, 64], got " + std::to_string(opts.tp));
  if (opts.block_size < 1 || opts.block_size > 1024)
    throw InputError("KV block size must be in [1, 1024]");
  Checkpoint ckpt(model_dir);
  int threads =
      opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  const int per_rank = std::max(1, threads / opts.tp);
  std::vector<ShardDims> dims;
  for (int r = 0; r < opts.tp; ++r)
    dims.push_back(shard_dims(cfg_, {r, opts.tp, opts.expert_split}));
  const int64_t bytes_per_block = cfg_.num_layers * 2 * opts.block_size * dims[0].num_kv_heads *
                                  cfg_.head_dim * static_cast<int64_t>(sizeof(float)) * opts.tp;
  num_blocks_ = std::max<int64_t>(1, opts.kv_cache_bytes / bytes_per_block);
  spdlog::info(
      "cpu backend: {} ({} layers, {} experts), tp={}, {} threads/rank, KV cache {} blocks x {} "
      "tokens ({:.1f} MiB)",
      arch_name(cfg_.arch), cfg_.num_layers, cfg_.num_experts, opts.tp, per_rank, num_blocks_,
      opts.block_size, num_blocks_ * bytes_per_block / 1048576.0);
  for (int r = 0; r < opts.tp; ++r) {
    auto rank = std::unique_ptr<CpuRank>(
        new CpuRank{r, dims[r], load_weights(ckpt, cfg_, {r, opts.tp, opts.expert_split}),
                    HostKvCache(cfg_.num_layers, num_blocks_, opts.block_size, dims[r].num_kv_heads,
                                cfg_.head_dim),
                    std::make_unique<ThreadPool>(per_rank)});
    ranks_.push_back(std::move(rank));
  }
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::forward(const StepBatch& batch, std::vector<float>& logits) {
  // Checked before any rank starts: a bad index caught inside one rank thread would leave the
  // others waiting at a barrier.
  validate_step_batch(batch, cfg_, num_blocks_, opts_.block_size);
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

}  // namespace moebatch
