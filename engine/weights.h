// Model weights as plain per-layer structs, and the loader that fills them for one rank's shard.
//
// The structs are templates over the tensor type so that "which hub tensor, which slice goes
// where" (a TensorPlan) is written once: the CPU backend materializes plans into fp32 host
// tensors, the CUDA backend materializes the same plans into bf16 device tensors
// (read_plan_bf16), and tests can inspect plans directly.
//
// Tensor parallelism (world ranks, in-process): attention heads are split (q/k/v
// column-parallel, o_proj row-parallel); when there are fewer kv heads than ranks each kv head is
// replicated on world/num_kv_heads ranks. MLPs are split along the intermediate dim (gate/up rows,
// down columns) or, with ExpertSplit::Expert, whole experts are divided among ranks (expert
// parallel). Either way a rank's MLP output is a partial sum, reduced with one all-reduce.
// lm_head is vocab-parallel when the vocab divides evenly (then gathered), else replicated.
// Router, norms and embeddings are replicated. Gated DeltaNet layers split by key-head groups
// (each with its num_v/num_k value heads): in_proj, conv channels, A_log and dt_bias rows of the
// rank's heads, out_proj columns of its value heads (row-parallel, one all-reduce).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace moebatch {

/// Storage format of a weight tensor as a backend holds it. The CPU backend holds fp32; the CUDA
/// backend holds bf16, or keeps a checkpoint's compressed weights compressed: FP8 blocks and
/// NVFP4 in the packed layouts of engine/packed_weights.h. Each compressed format has a loader
/// path that keeps its bytes as they are and a case in the GEMM dispatch of each backend
/// (engine/cuda/linear.h); an unsupported combination fails loudly there.
enum class WeightFormat {
  F32,
  Bf16,
  Fp8Block,
  Nvfp4,
  Int8,  ///< int8 codes, f32 scale and min per group of 16 or 32 (GGUF Q8_0, Q5_K, Q6_K)
  Int4,  ///< 4-bit codes, f32 scale and min per group of 32 (GGUF Q4_K)
};

/// Human name of a format ("bf16", ...).
const char* weight_format_name(WeightFormat f);

/// How MoE layers are divided among tensor-parallel ranks.
enum class ExpertSplit { Intermediate, Expert };

/// Which shard of the model a rank holds.
struct ShardSpec {
  int rank = 0;                                          ///< this rank, 0..world-1
  int world = 1;                                         ///< number of ranks
  ExpertSplit expert_split = ExpertSplit::Intermediate;  ///< MoE split mode
  bool vocab_parallel_lm_head = true;                    ///< split lm_head rows when divisible
};

/// Per-rank sizes implied by a ModelConfig and a ShardSpec (validated by shard_dims()).
struct ShardDims {
  int64_t num_heads = 0;            ///< local query heads
  int64_t num_kv_heads = 0;         ///< local kv heads
  int64_t head0 = 0;                ///< first global query head of this rank
  int64_t kv_head0 = 0;             ///< first global kv head of this rank
  int64_t intermediate = 0;         ///< local dense MLP width
  int64_t moe_intermediate = 0;     ///< local per-expert width
  int64_t shared_intermediate = 0;  ///< local shared-expert width
  int64_t num_experts = 0;          ///< experts stored on this rank
  int64_t expert0 = 0;              ///< global index of the first stored expert
  int64_t vocab = 0;                ///< local lm_head rows
  int64_t vocab0 = 0;               ///< first global vocab row of this rank
  bool vocab_split = false;         ///< lm_head rows are split across ranks
  int64_t lin_k_heads = 0;          ///< local Gated DeltaNet key heads
  int64_t lin_v_heads = 0;          ///< local Gated DeltaNet value heads
  int64_t lin_k_head0 = 0;          ///< first global key head (value heads start at ·nv/nk)
};

/// Validates divisibility for `spec` and returns the local sizes; InputError names the field.
ShardDims shard_dims(const ModelConfig& cfg, const ShardSpec& spec);

/// fp32 values of one sequence's Gated DeltaNet state in one linear-attention layer on one rank:
/// conv [C, K-1] (C = 2·nk·dk + nv·dv local channels) and ssm [nv, dk, dv].
struct LinearStateFloats {
  int64_t conv = 0;
  int64_t ssm = 0;
};
LinearStateFloats linear_state_floats(const ModelConfig& cfg, const ShardDims& d);

/// One block copy: rows [row0, row0+rows) x cols [col0, col0+cols) of a hub tensor (1-D tensors
/// are viewed as [n, 1], N-D ones as [shape[0], product of the rest]) into destination rows
/// starting at dst_row0.
struct PlanPiece {
  std::string name;                ///< hub tensor name
  std::vector<int64_t> src_shape;  ///< full shape the config implies (checked)
  int64_t row0 = 0, rows = 0;      ///< source row range
  int64_t col0 = 0, cols = 0;      ///< source column range
  int64_t dst_row0 = 0;            ///< destination row of the first copied row
};

/// How to build one destination tensor from checkpoint slices. Empty shape: field absent.
struct TensorPlan {
  std::vector<int64_t> shape;     ///< destination shape (its last dim is the row width)
  std::vector<PlanPiece> pieces;  ///< copies that together fill the destination
  /// How a backend that keeps compressed weights stores it (assign_weight_formats,
  /// engine/packed_weights.h); the CPU backend reads every tensor as fp32 whatever this says.
  WeightFormat format = WeightFormat::Bf16;
  int group = 0;  ///< inputs per scale of a compressed format (0 for bf16)
  bool empty() const { return shape.empty(); }
  int64_t numel() const;
};

/// An fp32 row-major host tensor (the CPU backend's storage).
struct HostTensor {
  std::vector<int64_t> shape;  ///< dims, outermost first; empty when absent
  std::vector<float> data;     ///< numel values
  bool empty() const { return shape.empty(); }
  const float* ptr() const { return data.data(); }
};

/// One decoder layer. Sizes are per rank: nh, nkv = local heads, hd = head_dim, H = hidden,
/// I = local dense width, Ie = local expert width, Is = local shared width, E = stored experts;
/// Gated DeltaNet: nk, nv = local key/value heads, r = nv/nk, dk, dv = their dims, K = conv
/// width, C = 2*nk*dk + nv*dv conv channels. A layer has either the attention fields (wqkv..wo)
/// or the lin_* ones.
template <class T>
struct LayerWeightsT {
  T input_norm;      // [H]
  T wqkv;            // [(nh*g + 2*nkv)*hd, H] rows: q heads, then k heads, then v heads; with an
                     // output gate (g = 2) then the gate rows of the q heads
  T bqkv;            // [(nh + 2*nkv)*hd]    (qkv_bias only)
  T q_norm;          // [hd]      (qk_norm only)
  T k_norm;          // [hd]      (qk_norm only)
  T wo;              // [H, nh*hd]
  T post_norm;       // [H]
  T mlp_gate_up;     // [2*I, H]  dense layers: rows 0..I-1 gate, I..2I-1 up
  T mlp_down;        // [H, I]    dense layers
  T router;          // [E_all, H] MoE layers, all experts on every rank
  T w_gate_up;       // [E, 2*Ie, H] MoE layers, stacked experts
  T w_down;          // [E, H, Ie]
  T shared_gate_up;  // [2*Is, H] shared expert (Qwen2-MoE)
  T shared_down;     // [H, Is]
  T shared_gate;     // [1, H]    sigmoid gate of the shared expert
  T lin_in;          // [nk*(2dk + 2r*dv) + 2*nv, H] in_proj_qkvz rows (per key head: q, k, then
                     // v and z of its r value heads), then in_proj_ba rows (per key head: b, a)
  T lin_conv;        // [C, K]    causal depthwise conv; channels q (nk*dk), k (nk*dk), v (nv*dv)
  T lin_dt_bias;     // [nv]
  T lin_a_log;       // [nv]      decay g = -exp(A_log) * softplus(a + dt_bias)
  T lin_norm;        // [dv]      gated RMSNorm weight (applied as w, not 1 + w)
  T lin_out;         // [H, nv*dv]

  /// Calls f(mine, theirs) for every field, pairing this layer with `o` of another tensor type.
  template <class U, class F>
  void zip(const LayerWeightsT<U>& o, F&& f) {
    f(input_norm, o.input_norm);
    f(wqkv, o.wqkv);
    f(bqkv, o.bqkv);
    f(q_norm, o.q_norm);
    f(k_norm, o.k_norm);
    f(wo, o.wo);
    f(post_norm, o.post_norm);
    f(mlp_gate_up, o.mlp_gate_up);
    f(mlp_down, o.mlp_down);
    f(router, o.router);
    f(w_gate_up, o.w_gate_up);
    f(w_down, o.w_down);
    f(shared_gate_up, o.shared_gate_up);
    f(shared_down, o.shared_down);
    f(shared_gate, o.shared_gate);
    f(lin_in, o.lin_in);
    f(lin_conv, o.lin_conv);
    f(lin_dt_bias, o.lin_dt_bias);
    f(lin_a_log, o.lin_a_log);
    f(lin_norm, o.lin_norm);
    f(lin_out, o.lin_out);
  }
};

/// The whole model for one rank.
template <class T>
struct ModelWeightsT {
  T embed;                               // [V, H] replicated
  std::vector<LayerWeightsT<T>> layers;  // num_layers
  T final_norm;                          // [H]
  T lm_head;                             // [V_local, H] (embed rows when tied)
};

using ModelPlan = ModelWeightsT<TensorPlan>;
using ModelWeights = ModelWeightsT<HostTensor>;
using LayerWeights = LayerWeightsT<HostTensor>;

/// Builds the slice plan of rank `spec.rank`: hub names, expected full shapes, slices.
ModelPlan plan_weights(const ModelConfig& cfg, const ShardSpec& spec);

/// Fills `dst` (plan.numel() floats) from `src`, checking names, shapes and dtypes and
/// dequantizing FP8 blocks. Throws InputError naming the tensor, expected vs actual.
void read_plan_f32(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan,
                   float* dst);
/// Same, narrowing to bf16 (round to nearest even) for backends that store bf16.
void read_plan_bf16(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan,
                    uint16_t* dst);

/// Checks every piece of `plan` against `src` — present, shape, dtype, scales — without reading
/// the weights: loaders call it before allocating, so a wrong checkpoint is refused naming the
/// tensor before any large allocation or GPU work. Throws InputError.
void check_weight_plan(const WeightSource& src, const ModelConfig& cfg, const ModelPlan& plan);

/// Loads rank `spec.rank`'s fp32 weights.
ModelWeights load_weights(const WeightSource& src, const ModelConfig& cfg, const ShardSpec& spec);

}  // namespace moebatch
