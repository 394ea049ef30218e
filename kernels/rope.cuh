// Per-head RMSNorm of q and k (Qwen3) followed by rotary position embedding, NEOX style, in
// place. The first rotary_dim dims rotate in pairs (i, i + rotary_dim/2) with
// inv_freq = theta^(-2i/rotary_dim); the rest are only normalised (partial rotary, Qwen3-Next).
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Operands of qk_norm_rope. Token t's head h lives at q + t*q_stride + h*head_dim.
struct QkNormRopeParams {
  bf16* q = nullptr;               ///< [tokens, q_stride], n_q_heads heads, in place
  bf16* k = nullptr;               ///< [tokens, k_stride], n_kv_heads heads, in place
  int64_t q_stride = 0;            ///< elements between tokens (lets q/k live inside a fused qkv row)
  int64_t k_stride = 0;
  const bf16* q_norm = nullptr;    ///< [head_dim] or nullptr: no norm (Qwen2-MoE)
  const bf16* k_norm = nullptr;    ///< [head_dim] or nullptr
  const int32_t* positions = nullptr;  ///< [tokens]
  /// [tokens, rd / 2] (cos, sin) per rotated pair from rope_rotation_table over the same
  /// positions (rd = rotary_dim, or head_dim when 0), or nullptr: computed here per block.
  const float2* rotation = nullptr;
  int tokens = 0;
  int n_q_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;                ///< multiple of 4, <= 256
  int rotary_dim = 0;              ///< leading dims that rotate, multiple of 4; 0: all of head_dim
  float theta = 1e6f;
  float eps = 1e-6f;
  float norm_offset = 0.f;         ///< norm weights applied as (norm_offset + w): 1 for Qwen3-Next
  // Optional paged-cache write (kv_cache.cuh layout), fused so a decode layer saves a launch:
  // with k_cache set, token t's rotated k heads and its v heads also go to slot
  // slot_mapping[t] (negative: skipped).
  bf16* k_cache = nullptr;         ///< [num_slots, n_kv_heads * head_dim] or nullptr: no write
  bf16* v_cache = nullptr;
  const bf16* v = nullptr;         ///< [tokens, v_stride], n_kv_heads heads
  int64_t v_stride = 0;
  const int32_t* slot_mapping = nullptr;  ///< [tokens]
  /// Let the next kernel launch at this one's start (kernels/launch.cuh, pdl_trigger_early):
  /// the caller knows what follows.
  bool trigger_early = false;
};

/// Leading dims of a head that rotate: `rotary_dim`, or all `head_dim` when it is 0 (the
/// QkNormRopeParams convention); rotation tables hold half as many (cos, sin) per token.
__host__ __device__ inline int rope_rotated_dims(int rotary_dim, int head_dim) {
  return rotary_dim > 0 ? rotary_dim : head_dim;
}

/// table[t, i] = (cos, sin) of positions[t] · theta^(-2i / rotary_dim) for i < rotary_dim / 2,
/// exactly as qk_norm_rope computes them: every layer of a forward rotates by the same positions,
/// so the forward computes this once (the precise sincosf is most of qk_norm_rope's own cost).
void rope_rotation_table(const int32_t* positions, int tokens, int rotary_dim, float theta, float2* table,
                         cudaStream_t stream);

/// The same operands with the k heads and the cache write dropped: q's norm and rotation alone
/// (attention_prefill's rope_q where its kernel does not rotate q itself).
inline QkNormRopeParams qk_norm_rope_q_only(QkNormRopeParams p) {
  p.k = p.q;
  p.k_stride = p.q_stride;
  p.n_kv_heads = 0;
  p.k_cache = nullptr;
  return p;
}

/// Normalizes (when weights are given) and rotates q and k in place; fp32 math, one rounding.
/// With a cache given, also writes the rotated k and the v rows to their slots (bit-exact copies).
void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
