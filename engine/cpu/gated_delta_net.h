// Qwen3-Next's Gated DeltaNet linear attention on the CPU, in its recurrent form (token by token,
// fp32), and the per-sequence state it carries between steps.
//
// State of one sequence in one layer (rank-local heads; docs/engine.md "Qwen3-Next"):
//   conv [C, K-1]   the last K-1 inputs of the causal depthwise conv, oldest first
//                   (C = 2·nk·dk + nv·dv channels: q, k, v)
//   ssm  [nv, dk, dv]  the delta-rule matrix S of each value head
// Both live in a state slot (StepBatch::state_slots); a slot is zeroed when a sequence starts in
// it (CpuBackend::forward), and a chunk or decode token continues from what the slot holds.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/thread_pool.h"
#include "engine/weights.h"

namespace moebatch {

/// One rank's recurrent state of every linear-attention layer, per state slot (host memory).
struct HostLinearState {
  int64_t slots = 0;                     ///< state slots (sequences that can hold state)
  int64_t conv_floats = 0;               ///< per slot and layer: C · (K-1)
  int64_t ssm_floats = 0;                ///< per slot and layer: nv · dk · dv
  std::vector<std::vector<float>> conv;  ///< per layer [slots, C, K-1]; empty: full attention
  std::vector<std::vector<float>> ssm;   ///< per layer [slots, nv, dk, dv]

  /// Zeroed state for the linear-attention layers of `cfg`, sized for shard `d`.
  HostLinearState(const ModelConfig& cfg, const ShardDims& d, int64_t slots);
  /// Zeroes slot `s` in every layer (a new sequence starts there).
  void reset(int32_t s);
  /// Bytes held.
  int64_t bytes() const;
};

/// Gated DeltaNet mixer of layer `layer` over batch `b` (x [n, H] = normed hidden states):
/// in_proj → causal conv + SiLU (continuing each sequence's conv state) → L2-normed q, k → gated
/// delta rule (continuing its S) → gated RMSNorm (norm(o) · silu(z)) → out_proj. Writes this
/// rank's partial sum y [n, H] and advances the state of every row's slot.
void gated_delta_net(const ModelConfig& cfg, const ShardDims& d, const LayerWeights& L,
                     ThreadPool& pool, const StepBatch& b, int64_t layer, HostLinearState& st,
                     const float* x, float* y);

}  // namespace moebatch
