// What one rank's CUDA forward works on: bf16 device weights (the same per-layer structs the
// loader plans), the paged KV cache, the activation and step-input buffers, and the shape of one
// forward call. Everything is owned by CudaBackend and passed to the forward explicitly.
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/weights.h"
#include "kernels/types.cuh"

namespace moebatch {

using kernels::bf16;

/// A bf16 view into device memory owned by an arena (no ownership here).
struct DeviceTensor {
  bf16* ptr = nullptr;         ///< first element
  std::vector<int64_t> shape;  ///< dims, outermost first; empty when the field is absent
  bool empty() const { return shape.empty(); }
  int64_t numel() const;
};

using DeviceModelWeights = ModelWeightsT<DeviceTensor>;
using DeviceLayerWeights = LayerWeightsT<DeviceTensor>;

/// Paged KV cache of one rank: per layer k and v [num_blocks, block_size, nkv, hd]. Block
/// `num_blocks - 1` is a scratch block that padded decode rows write to and read from, so the
/// engine's block manager sees one block fewer.
struct DeviceKvCache {
  bf16* base = nullptr;     ///< [layers, 2, num_blocks, block_size, nkv, hd]
  int64_t num_blocks = 0;   ///< including the scratch block
  int64_t block_size = 0;   ///< tokens per block
  int64_t num_kv_heads = 0; ///< local kv heads
  int64_t head_dim = 0;     ///< per-head width
  int64_t layer_elems() const { return num_blocks * block_size * num_kv_heads * head_dim; }
  bf16* k(int64_t layer) const { return base + 2 * layer * layer_elems(); }
  bf16* v(int64_t layer) const { return base + (2 * layer + 1) * layer_elems(); }
};

/// Capacities every buffer of StepBuffers is sized for.
struct StepCapacity {
  int64_t tokens = 0;       ///< T: tokens per forward call
  int64_t logits_rows = 0;  ///< R: rows per lm_head call (= sampled rows per step)
  int64_t table_width = 0;  ///< W: block-table entries per sequence
  int64_t attn_splits = 1;  ///< most split-K partitions of decode attention
};

/// Activations and step inputs of one forward call, carved out of one device allocation.
/// Fixed addresses: decode graphs captured once keep reading them.
struct StepBuffers {
  // step inputs (uploaded before each call)
  int32_t* tokens = nullptr;        // [T]
  int32_t* positions = nullptr;     // [T]
  int32_t* slots = nullptr;         // [T] KV slot of each token
  int32_t* q_start = nullptr;       // [T + 1] query-token prefix sums per attention sequence
  int32_t* kv_lens = nullptr;       // [T] context length per attention sequence
  int32_t* block_tables = nullptr;  // [T, W] (row width = the call's table_width)
  int32_t* logits_rows = nullptr;   // [T] token index of each logits row
  // sampling controls of the R rows of the last lm_head call
  float* temperature = nullptr;     // [R]
  int32_t* top_k = nullptr;         // [R]
  float* top_p = nullptr;           // [R]
  uint64_t* seeds = nullptr;        // [R]
  uint64_t* steps = nullptr;        // [R]
  int32_t* sampled = nullptr;       // [R]
  // activations
  bf16* x = nullptr;                // [T, H] residual stream
  bf16* h = nullptr;                // [T, H] normed input of attention / MLP; final norm output
  bf16* o = nullptr;                // [T, H] branch output (o_proj, MLP)
  bf16* qkv = nullptr;              // [T, (nh + 2 nkv) hd]
  bf16* attn = nullptr;             // [T, nh hd]
  float* router_logits = nullptr;   // [T, E]
  int32_t* topk_ids = nullptr;      // [T, k]
  float* topk_weights = nullptr;    // [T, k]
  int32_t* sorted_ids = nullptr;    // [moe_align_capacity(T k, E)]
  int32_t* expert_offsets = nullptr;// [E + 1]
  int32_t* active_experts = nullptr;// [E + 1]: count, then the experts with pairs
  int32_t* route_counter = nullptr; // [1] moe_route_small's block counter (zeroed at start)
  bf16* gate_up = nullptr;          // [max(T k 2Ie, T 2I, T 2Is)]
  bf16* act = nullptr;              // half of gate_up
  bf16* expert_out = nullptr;       // [T k, H]; also the shared expert's [T, H] output
  float* attn_ws = nullptr;         // split-K workspace of decode attention
  bf16* xr = nullptr;               // [R, H] final-normed rows that need logits
  float* logits = nullptr;          // [R, V]
  StepCapacity cap;                 ///< what the buffers hold
};

/// Bytes StepBuffers needs for `cap` (the memory plan uses this before allocating).
size_t step_buffer_bytes(const ModelConfig& cfg, const ShardDims& d, const StepCapacity& cap);
/// Carves StepBuffers out of `base` (step_buffer_bytes(...) bytes, 256-byte aligned).
StepBuffers carve_step_buffers(void* base, const ModelConfig& cfg, const ShardDims& d,
                               const StepCapacity& cap);

/// Shape of one forward call (host-side bounds; the arrays are in StepBuffers).
struct StepShape {
  int tokens = 0;       ///< tokens in the call
  int seqs = 0;         ///< attention sequences (runs of consecutive positions of one sequence)
  int max_q_len = 0;    ///< longest run
  int max_kv_len = 0;   ///< bound on kv_lens (decode graphs: the bucket's bound)
  int table_width = 0;  ///< row width of block_tables
  int attn_splits = 1;  ///< split-K partitions (decode only)
  bool decode = false;  ///< one query token per sequence: decode attention kernel
};

/// Accumulates device time per forward stage from events recorded between stages (profiling;
/// never used inside a captured graph).
class StageTimer {
 public:
  StageTimer() = default;
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  /// Starts timing on `stream`.
  void begin(cudaStream_t stream);
  /// Attributes the time since the previous mark to `stage`.
  void mark(const char* stage, cudaStream_t stream);
  /// Synchronizes and adds every interval to the per-stage totals (milliseconds).
  void collect();
  /// Stage name and total milliseconds, in first-seen order.
  const std::vector<std::pair<std::string, double>>& totals() const { return totals_; }

 private:
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> labels_;
  size_t used_ = 0;
  std::vector<std::pair<std::string, double>> totals_;
};

/// Everything one rank's forward needs.
struct CudaRank {
  int rank = 0;                    ///< tensor-parallel rank (0 here)
  ShardDims dims;                  ///< local sizes
  DeviceModelWeights weights;      ///< bf16 shard
  DeviceKvCache kv;                ///< paged cache
  StepBuffers buf;                 ///< activations and inputs
  cublasHandle_t cublas = nullptr; ///< bound to the forward's stream on each call
};

/// Runs the decoder over the call's tokens: embeddings through the final norm (into buf.h),
/// writing every token's k/v into its slot. `timer` may be null.
void cuda_forward(const ModelConfig& cfg, CudaRank& r, const StepShape& s, cudaStream_t stream,
                  StageTimer* timer);

/// lm_head on logits rows [first, first + rows) of the call (rows <= cap.logits_rows):
/// gathers the final-normed rows and writes buf.logits [rows, V] in fp32.
void cuda_lm_head(const ModelConfig& cfg, CudaRank& r, int first, int rows, int tokens,
                  cudaStream_t stream, StageTimer* timer);

}  // namespace moebatch
