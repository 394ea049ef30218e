// The CUDA backend of the engine on one GPU: bf16 weights loaded through the same plans as the
// CPU backend, a paged KV pool sized by a memory plan, the forward of engine/cuda/forward.cpp,
// decode steps replayed from CUDA graphs captured per padded batch size, and sampling on the
// device so a step returns token ids instead of [rows, vocab] logits.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/cuda_model.h"
#include "engine/engine.h"
#include "engine/weights.h"

namespace moebatch {

/// Options of the CUDA backend.
struct CudaBackendOptions {
  int device = 0;                        ///< CUDA device ordinal
  ShardSpec shard;                       ///< this rank's shard (world 1 until tensor parallelism)
  double gpu_memory_utilization = 0.90;  ///< share of the GPU's memory this process may use
  int64_t block_size = 16;               ///< tokens per KV block
  int64_t max_num_seqs = 64;             ///< sampled rows per step; decode graphs up to this batch
  int64_t max_num_batched_tokens = 2048; ///< tokens per forward call (longer steps are chunked)
  int64_t max_model_len = 0;             ///< longest sequence; 0: max_position_embeddings
  int64_t max_kv_cache_bytes = 0;        ///< cap on the KV pool; 0: everything the plan leaves
  bool cuda_graphs = true;               ///< replay decode steps from captured graphs
};

/// Where the GPU's memory goes, decided once at start (bytes).
struct MemoryPlan {
  size_t total = 0;        ///< device memory
  size_t free_at_start = 0;///< free before this backend allocated anything
  size_t budget = 0;       ///< gpu_memory_utilization · total − memory others already use
  size_t weights = 0;      ///< bf16 weight arena
  size_t activations = 0;  ///< step buffers
  size_t reserve = 0;      ///< cuBLAS workspace, graphs, allocator slack
  size_t kv = 0;           ///< KV pool
  int64_t kv_blocks = 0;   ///< blocks the engine may use (one more is the padding scratch block)
};

/// One GPU running the whole model (TP = 1).
class CudaBackend final : public Backend {
 public:
  /// Loads `model_dir` (config.json + safetensors) onto the GPU. InputError on a bad checkpoint
  /// or when the memory plan does not fit (the message names the numbers).
  CudaBackend(const std::filesystem::path& model_dir, const CudaBackendOptions& opts);
  /// A model of config `cfg` with seeded random weights generated on the GPU (benchmarks).
  CudaBackend(const ModelConfig& cfg, uint64_t seed, const CudaBackendOptions& opts);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  int64_t num_kv_blocks() const override { return plan_.kv_blocks; }
  int64_t block_size() const override { return opts_.block_size; }
  void forward(const StepBatch& batch, std::vector<float>& logits) override;
  bool samples_on_device() const override { return true; }
  void forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                      std::vector<int32_t>& tokens) override;

  /// The memory plan decided at start.
  const MemoryPlan& memory_plan() const { return plan_; }
  /// Turns decode-graph replay on or off (off: the same launches run eagerly).
  void set_cuda_graphs(bool on) { opts_.cuda_graphs = on; }
  /// Decode graphs captured so far.
  size_t num_graphs() const { return graphs_.size(); }
  /// Runs `batch` once eagerly with events between stages and returns milliseconds per stage
  /// (summed over layers), in first-seen order.
  std::vector<std::pair<std::string, double>> profile(const StepBatch& batch);

 private:
  struct Chunk;
  void init(const ModelConfig& cfg, const std::filesystem::path* model_dir, uint64_t seed);
  void plan_memory(size_t weights, size_t activations);
  Chunk prepare(const StepBatch& b, int t0, int t1) const;
  void upload(const Chunk& c);
  void run_chunk(const Chunk& c);
  // Pinned bytes of the sampling controls and sampled tokens (5 arrays of R, 8-byte slots).
  size_t sampling_staging_bytes() const { return static_cast<size_t>(opts_.max_num_seqs) * 40; }
  // Runs the whole batch; for each logits row calls on_rows(first_row, count) with buf.logits
  // holding those rows' logits.
  template <class OnRows>
  void run(const StepBatch& b, OnRows&& on_rows);

  ModelConfig cfg_;
  CudaBackendOptions opts_;
  MemoryPlan plan_;
  CudaRank rank_;
  int num_sms_ = 0;
  int64_t max_model_len_ = 0;
  void* weight_mem_ = nullptr;
  void* kv_mem_ = nullptr;
  void* buf_mem_ = nullptr;
  void* cublas_ws_ = nullptr;
  void* pinned_ = nullptr;  // host staging of step inputs and sampled tokens
  size_t pinned_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;  // (batch bucket, kv bucket)
  StageTimer* timer_ = nullptr;                           // set only inside profile()
};

/// An Engine over a CudaBackend for `model_dir`; the backend's row and token capacities follow
/// the engine's scheduler limits. Used by the CLI and the service for `--backend cuda`.
std::unique_ptr<Engine> make_cuda_engine(const std::filesystem::path& model_dir,
                                         CudaBackendOptions backend_opts,
                                         const EngineOptions& engine_opts);

}  // namespace moebatch
