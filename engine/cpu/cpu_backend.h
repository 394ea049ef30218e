// The fp32 CPU reference backend: one thread per tensor-parallel rank, each with its own weight
// shard, KV cache shard, recurrent-state shard (linear-attention models) and thread pool, joined
// by an InProcessComm.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/comm.h"
#include "engine/cpu/gated_delta_net.h"
#include "engine/cpu/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/weights.h"

namespace moebatch {

/// Options of the CPU backend.
struct CpuBackendOptions {
  int tp = 1;                          ///< tensor-parallel ranks (threads)
  int threads = 0;                     ///< total compute threads; 0 = hardware concurrency
  int64_t block_size = 16;             ///< tokens per KV block
  int64_t kv_cache_bytes = 256 << 20;  ///< KV budget over all ranks; sets the block count
  ExpertSplit expert_split = ExpertSplit::Intermediate;  ///< MoE sharding mode
  int64_t state_slots = 16;  ///< sequences holding recurrent state (the engine's max_num_seqs)
};

/// Everything one rank's forward needs, passed explicitly.
struct CpuRank {
  int rank = 0;                            ///< rank index
  ShardDims dims;                          ///< local sizes
  ModelWeights weights;                    ///< this rank's shard (fp32)
  HostKvCache kv;                          ///< this rank's kv heads
  std::unique_ptr<ThreadPool> pool;        ///< this rank's compute threads
  std::unique_ptr<HostLinearState> state;  ///< linear-attention state slots (null: none)
};

/// Runs one rank's forward over `batch`. Rank 0 writes `logits` ([rows, vocab]).
void cpu_forward(const ModelConfig& cfg, CpuRank& r, Communicator& comm, const StepBatch& batch,
                 std::vector<float>& logits);

/// fp32 CPU backend over a checkpoint directory.
class CpuBackend final : public Backend {
 public:
  /// Loads config and weights of `model_dir` (a checkpoint directory or a .gguf file) for opts.tp
  /// ranks; InputError on bad input.
  CpuBackend(const std::filesystem::path& model_dir, const CpuBackendOptions& opts);
  ~CpuBackend() override;

  const ModelConfig& config() const override { return cfg_; }
  const BackendInfo& info() const override { return info_; }
  /// Runs every rank over `batch`. With linear-attention layers a block_tables row whose first
  /// token is at position 0 starts a new sequence: its state slot is zeroed first; any other
  /// row must continue exactly where its slot's state ended (checked).
  void forward(const StepBatch& batch, std::vector<float>& logits) override;

 private:
  // Checks the state slots of `batch` and zeroes those of sequences starting at position 0.
  void begin_state_step(const StepBatch& batch);

  ModelConfig cfg_;
  CpuBackendOptions opts_;
  BackendInfo info_;
  std::vector<std::unique_ptr<CpuRank>> ranks_;
  InProcessComm comm_;
  StateSlotTracker state_slots_;  // where each state slot's sequence ended
};

}  // namespace moebatch
