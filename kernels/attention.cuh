// Paged attention over the KV cache (layout in kv_cache.cuh), causal, grouped-query.
// One batch step holds sequences with a run of new query tokens each (a prefill chunk, or one
// decode token); their k/v are already written to the cache. Sequence s's query rows are
// [q_start[s], q_start[s+1]), the last of its kv_lens[s] positions, so query i sits at position
// kv_lens[s] - n_q + i and sees keys 0..that position.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/rope.cuh"
#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Which kernel attention_prefill runs where several take the shape: `best` picks (on Hopper the
/// wgmma kernel at head_dim 128 and 256); `mma_sync` keeps prefill off the wgmma kernel (on
/// mma.sync, or the CUDA-core kernel at head_dim 256), so that tests and benchmarks reach those
/// on Hopper too.
enum class AttentionPrefillKernel { best, mma_sync };

/// Operands of attention_prefill / attention_decode.
struct AttentionParams {
  bf16* out = nullptr;                ///< [num_tokens, n_q_heads * head_dim]
  const bf16* q = nullptr;            ///< [num_tokens, q_stride]; head h at h * head_dim
  int64_t q_stride = 0;
  const bf16* k_cache = nullptr;      ///< [num_blocks, block_size, n_kv_heads, head_dim]
  const bf16* v_cache = nullptr;
  const int32_t* block_tables = nullptr;  ///< [num_seqs, max_blocks_per_seq]
  const int32_t* q_start = nullptr;   ///< [num_seqs + 1] prefix sums of query tokens per sequence
  const int32_t* kv_lens = nullptr;   ///< [num_seqs] context length including the new tokens
  int num_seqs = 0;
  int num_tokens = 0;                 ///< q_start[num_seqs]
  int max_q_len = 0;                  ///< host bound on query tokens of any sequence
  int max_kv_len = 0;                 ///< host bound on kv_lens (sizes the split-K ranges)
  int max_blocks_per_seq = 0;
  int block_size = 16;
  int n_q_heads = 0;
  int n_kv_heads = 0;                 ///< divides n_q_heads
  int head_dim = 0;                   ///< 16, 32, 64, 128 or 256
  float scale = 0.f;                  ///< softmax scale, usually 1/sqrt(head_dim)
  int num_splits = 1;                 ///< split-K (flash-decoding) partitions of the key range
  float* workspace = nullptr;         ///< attention_workspace_floats(...) floats when num_splits > 1
  AttentionPrefillKernel prefill_kernel = AttentionPrefillKernel::best;
  /// Prefill on the persistent wgmma kernel (head_dim 128 on Hopper): at most this many blocks
  /// (0: one per SM). For tests, so that a small case walks many work items per block.
  int max_blocks = 0;
  /// Decode on the warp kernel only, where attention_decode_fuses_rope says so (elsewhere
  /// attention_decode fails its check): q (and `rope.k`, `rope.v`) are the raw qkv rows, and
  /// the kernel itself does what qk_norm_rope would do before it — q's and the new k's per-head
  /// norm and rotation, the new k and v written to their cache slot — so that a decode layer has
  /// one launch less. `rope` then describes the same rows as q (its
  /// q, q_stride and caches equal this struct's) with the forward's rotation table.
  bool fused_rope = false;
  /// Prefill: q holds the raw q heads of the qkv rows, and attention_prefill applies `rope`'s q
  /// norm and rotation to them first (`rope` describes the same rows: its q and q_stride are
  /// this struct's, n_q_heads and head_dim too, with the rotation table of the call's tokens) —
  /// the persistent wgmma kernel as each row tile's Q lands (attention_prefill_rotates_q), every
  /// other kernel after a q-only qk_norm_rope launch in place. The k heads must already be
  /// normalised, rotated and in the cache (qk_norm_rope with n_q_heads 0). It saves the prefill
  /// the q heads' write and second read: at 8192 tokens of the 30B shape, 134 of the ~176 MB the
  /// rotation launch moves.
  bool rope_q = false;
  QkNormRopeParams rope = {};
  /// Decode kernels: let the next kernel launch at this one's start (kernels/launch.cuh,
  /// pdl_trigger_early) — the caller knows what follows.
  bool trigger_early = false;
  /// Decode split kernel with 2..kAttentionClusterMaxSplits splits on a GPU with thread block
  /// clusters: a (sequence, kv head)'s splits run as one cluster and merge their partials
  /// through each other's shared memory, not the workspace and a ticket (the same arithmetic,
  /// bit for bit). Elsewhere ignored.
  bool cluster_merge = false;
};

/// Splits a cluster_merge launch takes at most (a portable cluster).
inline constexpr int kAttentionClusterMaxSplits = 8;

/// Ticket counters at the head of a split-K workspace: one per (sequence, kv head) of the
/// small-batch decode kernel (it takes fewer pairs than this), through which the last split of a
/// pair to finish combines them all. Zero them once when the workspace is allocated; every launch
/// leaves them zero again, so captured graphs replay it as it is.
constexpr int kAttentionCounters = 512;

/// Floats of workspace the split-K path needs: the counters (as 32-bit words, zero before the
/// first launch), then the partials, head_dim + 2 floats per (token, head, split).
inline size_t attention_workspace_floats(int num_tokens, int n_q_heads, int head_dim, int num_splits) {
  return num_splits > 1 ? kAttentionCounters + static_cast<size_t>(num_tokens) * n_q_heads *
                                                   num_splits * (head_dim + 2)
                        : 0;
}

/// Split count for decode: 1 when the (sequence, kv head) pairs alone cover every SM; else as
/// many as keep the (sequence, kv head, split) blocks within twice the SMs (one wave of the split
/// kernel), each split at least max(32, min_split_keys) keys, at most max_splits.
int attention_decode_splits(int num_seqs, int n_kv_heads, int max_kv_len, int num_sms, int max_splits,
                            int min_split_keys = 32);

/// Causal attention for many query tokens per sequence: tiles of (token, head) rows of one kv
/// group share each staged K/V tile, on bf16 tensor cores (fp32 scores, softmax and
/// accumulation; P rounded to bf16 for P·V): on Hopper warpgroup MMAs over 128-row tiles
/// (kernels/attention_wgmma.cu) at head_dim 256 and at head_dim 128 with 512 rows or more (the
/// longest sequence's tokens × heads per kv head) and a context past 128 keys, else mma.sync over
/// 64- or 128-row × 64-key tiles. head_dim 16, 256 off Hopper, num_splits > 1, scale <= 0 and q,
/// cache or out pointers not 16-byte aligned take the CUDA-core kernel of attention_decode with
/// tiles of 32 rows.
void attention_prefill(const AttentionParams& p, cudaStream_t stream);

/// Whether attention_prefill rotates p's q inside the attention kernel with rope_q (the
/// persistent wgmma kernel: head_dim 128, every dim rotating, the rotation table given, 16-byte
/// aligned norm weights) rather than in a qk_norm_rope launch before it.
bool attention_prefill_rotates_q(const AttentionParams& p);

/// Diagnostic builds (MOEBATCH_PHASE_CLOCKS, kernels/phase_clock.cuh): the cycles every row block
/// of the prefill kernel on wgmma spent per warpgroup in each AttentionPhase since the last call,
/// then the number of warpgroup blocks summed (kAttnPhases + 1 values), and resets them. Other
/// builds: empty.
std::vector<uint64_t> attention_prefill_take_phase_clocks();

/// Attention for one query token per sequence (decode), on tensor cores with K/V streamed from
/// the cache into MMA fragments (kernels/attention_decode.cu): below kWarpDecodeMinUnits
/// (sequence, kv head) pairs one launch with split-K over the key range (4 warps per split, the
/// last split of a pair to finish combines them), from there one warp per pair
/// (num_splits 1). head_dim 64/128 with ≤ 16 query heads per kv head, a positive scale and
/// 16-byte aligned rows; other shapes take the CUDA-core kernel (tiles of 8 rows, one token's GQA
/// group, and a combine launch after split-K) or, without split-K, the prefill kernel.
void attention_decode(const AttentionParams& p, cudaStream_t stream);

/// Whether attention_decode can take `p` with fused_rope set, and where the engine fuses: the
/// warp kernel of large decode batches (decode_on_warps: one split, at least kWarpDecodeMinUnits
/// (sequence, kv head) pairs, head_dim 64 / 128), every dim rotating, `rope` matching q and the
/// caches with the rotation table and slot mapping, its rows and norm weights 16-byte aligned.
/// The small-batch split kernel has no fused rope: there it measured slower than the separate
/// qk_norm_rope launch (H100, 30B shape, batch 1: 3.55 vs 3.51 ms in session 19, the writer
/// block reading the new k / v back from the cache; 3.249 vs 3.17-3.18 ms on 2026-12-06, with
/// them staged in shared memory), and was removed (the last tree with it: commit 552e1eb).
bool attention_decode_fuses_rope(const AttentionParams& p);

/// Whether attention_decode merges p's splits across a thread block cluster (cluster_merge asked,
/// the split kernel, 2..kAttentionClusterMaxSplits splits, a GPU that launches clusters).
bool attention_decode_merges_in_clusters(const AttentionParams& p);

}  // namespace moebatch::kernels
