// What one rank's CUDA forward works on: device weights in their storage format (the same
// per-layer structs the loader plans), the paged KV cache, the activation and step-input buffers,
// and the shape of one forward call. Owned by a CudaRank and passed to the forward explicitly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model_config.h"
#include "engine/weights.h"
#include "kernels/types.cuh"
#include "kernels/weight_codec.cuh"

namespace moebatch {

using kernels::bf16;

/// A weight tensor in device memory owned by an arena (no ownership here). The bytes are
/// untyped; the typed accessors check the format, so a kernel never reads a format it was not
/// written for (engine/cuda/linear.h dispatches GEMMs on `format`). Compressed formats keep
/// their scales beside the values in the layouts of engine/packed_weights.h.
struct DeviceTensor {
  void* data = nullptr;                      ///< first byte of the values
  WeightFormat format = WeightFormat::Bf16;  ///< how the bytes encode the values
  std::vector<int64_t> shape;                ///< dims, outermost first; empty: field absent
  void* scales = nullptr;  ///< Fp8Block, Int8, Int4: f32 per group; Nvfp4: e4m3 per 16
  float* row_scales = nullptr;               ///< Nvfp4: f32 per row
  float* mins = nullptr;                     ///< Int8, Int4: f32 per group
  int group = 0;                             ///< inputs per scale (compressed formats)
  /// Fp8Block: rows that share each scale, in aligned blocks from row 0 (128: the 128 × 128
  /// blocks of FP8 checkpoints and of --quantization fp8; 1: per row). Set after loading by
  /// looking at the scales (mark_block_scales), never assumed.
  int scale_rows = 1;
  /// Fp8Block with scale_rows 128 and 128-input groups, where the rank runs W8A8 projections
  /// (kernels::Fp8BlockGemm): the scales once per 128 × 128 block, [ceil(rows / 128)]
  /// [fp8_block_scale_ld(cols)], in memory the rank owns. Null otherwise.
  float* block_scales = nullptr;
  bool empty() const { return shape.empty(); }
  int64_t numel() const;
  /// Row width (the last dim) and rows (every other dim flattened).
  int64_t cols() const { return shape.size() > 1 ? shape.back() : 1; }
  int64_t rows() const { return empty() ? 0 : numel() / cols(); }
  /// Bytes held: values, scales and row scales.
  size_t bytes() const;
  /// The values as bf16; Error naming the format when the tensor holds another one.
  bf16* as_bf16() const;
  /// as_bf16(), or nullptr for an absent field (optional norms and biases).
  bf16* optional_bf16() const { return empty() ? nullptr : as_bf16(); }
  /// The tensor as the weight-taking kernels read it (any format but F32).
  kernels::QuantMatrix matrix() const;
  /// Rows [row0, rows()) as a [rows() - row0, cols()] view: values, scales and row scales moved
  /// to row0 (one expert of a stacked tensor; the rows a loader piece fills).
  DeviceTensor rows_from(int64_t row0) const;
};

using DeviceModelWeights = ModelWeightsT<DeviceTensor>;
using DeviceLayerWeights = LayerWeightsT<DeviceTensor>;

/// Paged KV cache of one rank: per KV layer (the layers whose mixer keeps a cache, in layer
/// order) k and v [num_blocks, block_size, nkv, hd]. Block `num_blocks - 1` is a scratch block
/// that padded decode rows write to and read from, so the engine's block manager sees one block
/// fewer.
struct DeviceKvCache {
  bf16* base = nullptr;      ///< [kv layers, 2, num_blocks, block_size, nkv, hd]
  int64_t num_blocks = 0;    ///< including the scratch block
  int64_t block_size = 0;    ///< tokens per block
  int64_t num_kv_heads = 0;  ///< local kv heads
  int64_t head_dim = 0;      ///< per-head width
  int64_t layer_elems() const { return num_blocks * block_size * num_kv_heads * head_dim; }
  bf16* k(int64_t kv_layer) const { return base + 2 * kv_layer * layer_elems(); }
  bf16* v(int64_t kv_layer) const { return base + (2 * kv_layer + 1) * layer_elems(); }
};

/// Recurrent state of the Gated DeltaNet layers of one rank (Qwen3-Next), fp32, in the layouts
/// of kernels/linear_attention.cuh: per linear layer (the layers whose mixer is linear
/// attention, in layer order) conv [slots, C, K−1] then ssm [slots, nv, dk, dv]. Slot s belongs
/// to the engine's sequence slot s; the kernels start a sequence at position 0 from zero, so a
/// reused slot needs no clearing.
struct DeviceLinearState {
  float* base = nullptr;    ///< [linear layers, slots, conv + ssm]
  int64_t slots = 0;        ///< sequences that can hold state
  LinearStateFloats per_slot;  ///< floats of one slot in one layer
  int64_t layer_floats() const { return slots * (per_slot.conv + per_slot.ssm); }
  float* conv(int64_t lin_layer) const { return base + lin_layer * layer_floats(); }
  float* ssm(int64_t lin_layer) const { return conv(lin_layer) + slots * per_slot.conv; }
  /// Bytes for `slots` sequences over the model's linear layers on shard `d` (0 without any).
  static size_t bytes(const ModelConfig& cfg, const ShardDims& d, int64_t slots) {
    if (cfg.num_linear_layers() == 0) return 0;
    const LinearStateFloats f = linear_state_floats(cfg, d);
    return static_cast<size_t>(cfg.num_linear_layers() * slots * (f.conv + f.ssm)) * sizeof(float);
  }
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
  int32_t* state_slots = nullptr;   // [T] recurrent-state slot per attention sequence (< 0: none)
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
  bf16* o = nullptr;                // [T, H] branch output (o_proj, MLP); a partial sum before
                                    //        the all-reduce when world > 1
  bf16* qkv = nullptr;              // [T, (nh g + 2 nkv) hd]: q | k | v (| output gate, g = 2)
  float2* rope_rotation = nullptr;  // [T, rotary_dim / 2] (cos, sin) of the call's positions,
                                    //        computed once per forward (null: no attention layer)
  bf16* attn = nullptr;             // [T, max(nh hd, nv dv)] attention or Gated DeltaNet output
  bf16* lin_proj = nullptr;         // [T, P] Gated DeltaNet in_proj output (P = lin_in rows)
  bf16* lin_mixed = nullptr;        // [T, C] its conv + SiLU output
  float* router_logits = nullptr;   // [T, E]
  int32_t* topk_ids = nullptr;      // [T, k]
  float* topk_weights = nullptr;    // [T, k]
  int32_t* sorted_ids = nullptr;    // [moe_align_capacity(T k, E)]
  int32_t* expert_offsets = nullptr;// [E + 1]
  int32_t* active_experts = nullptr;// [E + 1]: count, then the experts with pairs
  int32_t* align_ws = nullptr;      // [moe_align_workspace_ints(E)]: a prefill align's block counts
  int32_t* route_counter = nullptr; // [1] moe_route_small's block counter (zeroed at start)
  uint32_t* norm_counter = nullptr; // [1] gemv_stream_combine_norm's ticket counter (zeroed at start)
  bf16* gate_up = nullptr;          // [max(S 2Ie, T 2I, T 2Is)]
  bf16* act = nullptr;              // half of gate_up
  size_t gate_up_elems = 0;         // elements of gate_up (act holds half as many)
  bf16* expert_out = nullptr;       // [S, H] expert outputs by pair (or in sorted order: the
                                    //        many-token path); also the shared expert's [T, H]
  int32_t* row_of_pair = nullptr;   // [T k] sorted row of each pair (many-token path)
  int sorted_rows = 0;              // S = moe_align_capacity(T k, E, tile) ≥ T k
  float* attn_ws = nullptr;         // split-K workspace of decode attention
  bf16* xr = nullptr;               // [R, H] final-normed rows that need logits
  float* logits = nullptr;          // [R, V] full-vocab logits (rank 0 samples from these)
  float* logits_local = nullptr;    // [R, V_local] this rank's lm_head rows (= logits unless
                                    //                the lm_head is vocab-parallel)
  float* logits_gather = nullptr;   // [world, R, V_local] all-gather target (vocab-parallel only)
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

}  // namespace moebatch
