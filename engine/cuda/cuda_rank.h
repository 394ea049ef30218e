// One tensor-parallel rank of the CUDA backend on its device: the weight shard, KV pool, step
// buffers, stream, cuBLAS handle, decode graphs and pinned staging (engine/cuda/cuda_rank.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/cuda/cuda_model.h"
#include "engine/cuda/linear.h"
#include "engine/cuda/memory_plan.h"
#include "engine/cuda/stage_timer.h"
#include "engine/cuda/step_chunk.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "kernels/allreduce.cuh"

namespace moebatch {

/// cuBLAS workspace per rank: fixed, so cuBLAS allocates nothing while a graph is captured.
constexpr size_t kCublasWorkspace = 32u << 20;

/// Everything one rank owns and its forward reads. Methods run on the rank's thread (the
/// caller's with one rank) and make the rank's device current first; the destructor may run
/// on any thread.
class CudaRank {
 public:
  /// Rank `shard.rank` of `shard.world` on CUDA device `device`; `comm` joins the ranks (null
  /// when world is 1, or until the backend has created its communicator). Touches no device.
  CudaRank(const ModelConfig& cfg, const ShardSpec& shard, int device, Communicator* comm);
  ~CudaRank();
  CudaRank(const CudaRank&) = delete;
  CudaRank& operator=(const CudaRank&) = delete;

  /// Makes this rank's device current on the calling thread.
  void activate() const;
  /// Reads the device's total and free memory and its SM count (creates the context).
  void probe(size_t& total, size_t& free);
  /// Allocates what `p` plans, places the weights and fills them from `ckpt` (or with seeded
  /// random values when null), carves the step buffers for `cap` and zeroes the recurrent
  /// state of cap.logits_rows sequence slots (linear-attention models).
  void build(const ModelConfig& cfg, const ModelPlan& wplan, const MemoryPlan& p,
             const StepCapacity& cap, int64_t block_size, const WeightSource* ckpt, uint64_t seed);
  /// Copies a chunk's inputs into the step buffers through the pinned staging.
  void upload(const StepChunk& c);
  /// Forward + lm_head of a padded decode chunk: replays the graph of its key, or runs the
  /// launches eagerly and then captures them. `graphs` false: eager every time.
  void run_decode(const ModelConfig& cfg, const StepChunk& c, bool graphs, StageTimer* tm);
  /// Copies the first `count` logits rows [count, vocab] to `host` and waits for them.
  void download_logits(float* host, int count, int64_t vocab);
  /// Samples `count` logits rows on the device with rows[out_rows[i]]'s controls and writes
  /// tokens[out_rows[i]] (greedy when every row is greedy, else top-k/top-p).
  void sample(const std::vector<RowSampling>& rows, const int32_t* out_rows, int count,
              int64_t vocab, std::vector<int32_t>& tokens);
  /// Decode graphs captured so far.
  size_t num_graphs() const { return graphs_.size(); }
  /// The rank's handle, stream and dequantization scratch, for engine/cuda/linear.h.
  GemmContext gemm() const {
    return {cublas,          stream,     dequant_,    dequant_elems_, group_ptrs_host_,
            group_ptrs_dev_, group_cap_, stream_gemv, tma_experts,    fp8_gemm_.get(),
            a8_,             a8_bytes_,  pdl_trigger_early};
  }

  // What the forward (engine/cuda/forward.cpp) reads.
  const int rank;                   ///< tensor-parallel rank
  const int world;                  ///< ranks
  const int device;                 ///< CUDA ordinal
  Communicator* comm;               ///< collectives among ranks; null when world is 1 (set
                                    ///< by the backend before build)
  /// The peer-to-peer all-reduce of the backend's communicator (null: every all-reduce goes to
  /// `comm`); the forward fuses it with the add + RMSNorm after it for messages that fit.
  const kernels::AllReduceWorkspace* p2p = nullptr;
  const ShardDims dims;             ///< local sizes
  int num_sms = 0;                  ///< SMs of the device
  MemoryPlan plan;                  ///< this device's memory plan
  DeviceModelWeights weights;       ///< this rank's shard
  DeviceKvCache kv;                 ///< paged cache of the local kv heads
  DeviceLinearState lin_state;      ///< Gated DeltaNet state slots (Qwen3-Next), else empty
  StepBuffers buf;                  ///< activations and step inputs
  cudaStream_t stream = nullptr;    ///< every launch of the rank
  int32_t* host_offsets = nullptr;  ///< pinned [E + 1]: expert offsets of a many-token step
  int64_t sorted_moe_min_rows = 64;  ///< moe_sorted_min_rows_per_expert (×4 for compressed experts)
  bool wgmma_experts = false;        ///< that path's bf16 experts on kernels::moe_wgmma
  bool w8a8_experts = false;         ///< FP8-block experts on moe_wgmma_fp8 (implies wgmma_experts)
  bool stream_gemv = false;          ///< one-row bf16 projections on kernels::gemv_stream
  bool tma_experts = false;          ///< decode steps' bf16 / W8A8 experts on kernels::moe_gemm_tma
  bool router_norm = true;           ///< CudaBackendOptions::router_norm
  bool wgmma_attention = true;       ///< CudaBackendOptions::wgmma_attention
  bool fused_rope_attention = true;     ///< CudaBackendOptions::fused_rope_attention
  bool prefill_rope_q = true;           ///< CudaBackendOptions::prefill_rope_q
  bool cluster_attention_merge = true;  ///< CudaBackendOptions::cluster_attention_merge
  bool cluster_router = true;           ///< CudaBackendOptions::cluster_router
  bool pdl_trigger_early = true;        ///< CudaBackendOptions::pdl_trigger_early
  bool combine_norm_in_qkv = false;     ///< CudaBackendOptions::combine_norm_in_qkv (where qkv is on gemv_stream)
  bool mma_expert_gemv = true;          ///< CudaBackendOptions::mma_expert_gemv
  bool combine_in_down = true;          ///< CudaBackendOptions::combine_in_down
  bool w8a8_linear = false;          ///< FP8-block projections on kernels::Fp8BlockGemm (Hopper)
  cublasHandle_t cublas = nullptr;  ///< bound to `stream`, fixed workspace

 private:
  // Pinned bytes of the sampling controls and sampled tokens (5 arrays of R, 8-byte slots).
  size_t sampling_staging_bytes() const { return static_cast<size_t>(buf.cap.logits_rows) * 40; }
  // Compacts the block scales of the projections fp8_gemm_ takes (DeviceTensor::block_scales).
  void attach_block_scales();

  bool probed_ = false;  // a context exists: the destructor has something to release
  void* weight_mem_ = nullptr;
  void* kv_mem_ = nullptr;
  void* state_mem_ = nullptr;
  void* buf_mem_ = nullptr;
  void* cublas_ws_ = nullptr;
  bf16* dequant_ = nullptr;  // decoded compressed weight of a many-row dense GEMM
  size_t dequant_elems_ = 0;
  std::unique_ptr<kernels::Fp8BlockGemm> fp8_gemm_;  // w8a8_linear only
  uint8_t* a8_ = nullptr;           // quantized rows of a W8A8 projection (GemmContext::a8)
  size_t a8_bytes_ = 0;
  void* block_scales_mem_ = nullptr;  // DeviceTensor::block_scales of every W8A8 projection
  const void** group_ptrs_host_ = nullptr;  // pinned, kGroupedStages · 3 · group_cap_
  const void** group_ptrs_dev_ = nullptr;   // device, the same
  int group_cap_ = 0;
  void* pinned_ = nullptr;  // host staging of step inputs, sampling controls and tokens
  size_t pinned_bytes_ = 0;
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;  // (batch bucket, kv bucket)
};

}  // namespace moebatch
