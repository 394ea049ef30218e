// MoE routing: the router (softmax + top-k in one kernel) and the token->expert alignment that
// groups (token, k) pairs by expert for the grouped expert GEMM.
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Most experts the router kernel handles (registers hold experts/32 logits per lane).
constexpr int kRouterMaxExperts = 512;
/// Most experts per token.
constexpr int kRouterMaxTopK = 32;

/// Operands of moe_router_topk. Pair p = t * top_k + j is token t's j-th expert, best first.
struct RouterParams {
  int32_t* topk_ids = nullptr;     ///< [tokens, top_k]
  float* topk_weights = nullptr;   ///< [tokens, top_k] softmax probabilities (renormalized if asked)
  int tokens = 0;
  int num_experts = 0;             ///< <= kRouterMaxExperts
  int top_k = 0;                   ///< <= min(num_experts, kRouterMaxTopK)
  bool renormalize = true;         ///< norm_topk_prob: selected weights sum to 1
};

/// fp32 softmax over each row of router logits, top-k (ties: lower expert id first).
void moe_router_topk(const RouterParams& p, const float* logits, cudaStream_t stream);
/// Same, from bf16 logits.
void moe_router_topk(const RouterParams& p, const bf16* logits, cudaStream_t stream);

/// Operands of moe_align. Each expert's segment of sorted_ids is padded to a multiple of
/// block_m with the sentinel value num_pairs; segment e is [expert_offsets[e], expert_offsets[e+1]).
/// Order inside a segment is unspecified (rows of the expert GEMM are independent, so results
/// do not depend on it).
struct AlignParams {
  int32_t* sorted_ids = nullptr;      ///< [moe_align_capacity(...)] pair ids grouped by expert
  int32_t* expert_offsets = nullptr;  ///< [num_experts + 1] padded segment starts; last = total
  const int32_t* topk_ids = nullptr;  ///< [num_pairs] expert of each pair
  int num_pairs = 0;                  ///< tokens * top_k
  int num_experts = 0;                ///< <= 1024
  int block_m = 8;                    ///< GEMM tile rows (kMoeGemmTileM)
  /// Optional [num_experts + 1]: [0] = number of experts with pairs, then their ids ascending.
  /// moe_gemm then launches blocks only for those (at batch 1: 8 of 128 experts).
  int32_t* active_experts = nullptr;
  /// Expert parallel: this rank holds experts [expert0, expert0 + num_experts) of the router's.
  /// A pair's expert in every output is topk_ids - expert0 (local ids); pairs of other ranks'
  /// experts are dropped (no segment, no GEMM rows). 0 with every expert local.
  int expert0 = 0;
  /// Optional [moe_align_workspace_ints(num_experts)]: per-block counts, with which a prefill's
  /// many pairs are counted and placed by many blocks (two launches) instead of one.
  int32_t* workspace = nullptr;
};

/// Most blocks the many-pairs align spreads over.
constexpr int kAlignMaxBlocks = 64;
/// Size of AlignParams::workspace.
inline size_t moe_align_workspace_ints(int num_experts) {
  return static_cast<size_t>(kAlignMaxBlocks) * num_experts;
}

/// Size sorted_ids must have: every expert may waste block_m - 1 padding rows.
inline int moe_align_capacity(int num_pairs, int num_experts, int block_m) {
  return num_pairs + num_experts * (block_m - 1);
}

/// Counts pairs per expert, scans padded offsets and scatters pair ids; pairs whose expert lies
/// outside [expert0, expert0 + num_experts) are dropped. One block, or with a workspace and
/// enough pairs (a prefill's) up to kAlignMaxBlocks blocks in two launches.
void moe_align(const AlignParams& p, cudaStream_t stream);

/// Most tokens moe_route_small takes (decode batches up to 8).
constexpr int kRouteSmallMaxTokens = 8;

/// moe_route_small's optional first stage, the MLP norm of one rank (add_rmsnorm's semantics):
/// residual = bf16(residual + branch), out = rmsnorm(residual) · (weight_offset + weight); the
/// router then multiplies `out` (in shared memory) instead of reading x. residual and out are
/// written by the last block, when every block has read the residual.
struct RouteSmallNorm {
  const bf16* branch = nullptr;  ///< [tokens, hidden] the attention output; null: no fused norm
  bf16* residual = nullptr;      ///< [tokens, hidden] the residual stream, updated in place
  const bf16* weight = nullptr;  ///< [hidden]
  bf16* out = nullptr;           ///< [tokens, hidden] the normed rows (what x holds otherwise)
  float eps = 1e-6f;
  float weight_offset = 0.f;     ///< 1 for zero-centred norms (Qwen3-Next)
};

/// Bytes of shared memory the fused norm holds its rows in (each row twice: the sum it writes
/// back to the residual and the normed row); moe_route_small_fuses_norm says whether a step's
/// rows fit.
constexpr int kRouteSmallNormBytes = 16 << 10;

/// Whether moe_route_small can take the norm for `tokens` rows of `hidden` (two bf16 copies fit
/// in kRouteSmallNormBytes; at hidden 2048, up to 2 tokens, at 4096 one).
constexpr bool moe_route_small_fuses_norm(int tokens, int hidden) {
  return tokens >= 1 && tokens <= kRouteSmallMaxTokens && hidden > 0 && hidden % 8 == 0 &&
         static_cast<int64_t>(tokens) * hidden * 4 <= kRouteSmallNormBytes;
}

/// Operands of moe_route_small: router GEMM + softmax + top-k + align in one launch.
struct RouteSmallParams {
  RouterParams router;          ///< outputs topk_ids / topk_weights; tokens <= kRouteSmallMaxTokens
  AlignParams align;            ///< topk_ids = router.topk_ids, num_pairs = tokens * top_k;
                                ///< expert0 + num_experts <= router.num_experts
  const bf16* x = nullptr;      ///< [tokens, hidden] normed hidden states
  const bf16* weight = nullptr; ///< [num_experts, hidden] router weight
  float* logits = nullptr;      ///< [tokens, num_experts] fp32 router logits (also an output)
  int hidden = 0;               ///< multiple of 8
  /// One int that is 0 before the launch; the kernel leaves it 0 (graph replays reuse it).
  int32_t* counter = nullptr;
  RouteSmallNorm norm;          ///< the add + RMSNorm in front, or none (norm.branch null)
  /// No align after the top-k (`align` unused): for one token whose expert GEMVs take their
  /// experts straight from topk_ids (MoeGemmParams::direct_topk), where nothing reads the
  /// grouping and it was ~a third of the last block's serial tail.
  bool skip_align = false;
  /// One thread block cluster of 16 blocks (moe_route_small_prepare_cluster must have said yes
  /// on the device): the blocks meet at a cluster barrier and hand their logits over in shared
  /// memory, where the ticket form stores them, fences, counts blocks and reloads them
  /// (`counter` unused).
  bool cluster = false;
  /// Let the next kernel launch at this one's start (kernels/launch.cuh, pdl_trigger_early):
  /// the caller knows what follows.
  bool trigger_early = false;
};

/// Small-batch routing in one kernel: a warp per expert computes its fp32 logits for every token
/// (fixed order: results do not depend on batch neighbours); the last block to finish (or the
/// cluster's first block) runs moe_router_topk's softmax + top-k on them and moe_align's
/// grouping. Same outputs as the three launches linear (fp32 out) → moe_router_topk →
/// moe_align up to fp32 summation order; both forms give the same bits.
void moe_route_small(const RouteSmallParams& p, cudaStream_t stream);
/// Lets moe_route_small's cluster form launch on the current device (its 16-block clusters are
/// above the portable size) and says whether they fit there; once per device, outside graph
/// capture.
bool moe_route_small_prepare_cluster();

}  // namespace moebatch::kernels
