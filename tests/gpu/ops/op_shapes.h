// Shapes of each op family's cases and the factories that turn them into table rows. The
// factory fixes the op's stated tolerance (docs/kernels.md) and its name; op_table.cpp lists the
// shapes. Layouts follow docs/design.md.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/linear_attention.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/sampling.cuh"
#include "tests/gpu/ops/op_case.h"
#include "tests/gpu/ops/op_util.h"

namespace moebatch::ops {

// --- element-wise (cases_elementwise.cpp) ---------------------------------------------------

struct EmbeddingShape {
  int tokens, hidden, vocab;
  bool bad_ids = false;  ///< tokens 5 and 9 get ids -1 and vocab: zero rows (needs tokens > 9)
};
OpCaseDef embedding_case(const EmbeddingShape& s);

struct RmsNormShape {
  int rows, cols;
  bool add = false;  ///< add_rmsnorm: residual += in (bf16, checked bit-exact), then the norm
  float weight_offset = 0.f;  ///< 1: zero-centred weights (Qwen3-Next)
};
OpCaseDef rmsnorm_case(const RmsNormShape& s);

struct QkNormRopeShape {
  int tokens, n_q_heads, n_kv_heads, head_dim;
  bool norm = true;    ///< per-head RMSNorm weights (Qwen3); false: rotation only (Qwen2-MoE)
  bool cache = false;  ///< fused paged-cache write, one padding token (needs tokens > 2)
  int position = -1;   ///< every token at this position; -1: random in [0, 40000], token 0 at 0
  int rotary_dim = 0;  ///< partial rotary (Qwen3-Next); 0: the whole head
  float norm_offset = 0.f;  ///< 1: zero-centred norm weights (Qwen3-Next)
  bool table = false;  ///< (cos, sin) from rope_rotation_table (the engine's way), checked bit-equal to without
};
OpCaseDef qk_norm_rope_case(const QkNormRopeShape& s);

struct KvCacheWriteShape {
  int tokens, n_kv_heads, head_dim, num_slots;
  int64_t k_offset, stride;  ///< k at k_offset of a row of `stride` elements, v right after it
  bool padding = false;      ///< token 3 has slot -1 (skipped)
};
OpCaseDef kv_cache_write_case(const KvCacheWriteShape& s);

struct SiluMulShape {
  int rows, inter;
};
OpCaseDef silu_mul_case(const SiluMulShape& s);

struct SigmoidGateShape {
  int rows, cols;
  int gate_offset;  ///< the gate sits at this column of a wider row (as in the fused qkv rows)
};
OpCaseDef sigmoid_gate_case(const SigmoidGateShape& s);

struct MoeCombineShape {
  int tokens, top_k, hidden;
  bool weighted = true;  ///< false: weights nullptr (already applied)
  /// Expert parallel (> 0): each pair gets an expert id in [0, experts) and only the pairs of
  /// experts [expert0, expert0 + local_experts) are summed; the others' rows are NaN and must
  /// never be read.
  int experts = 0;
  int expert0 = 0, local_experts = 0;
  /// moe_combine_add_rmsnorm: the sum added into a residual and normalized (weight as
  /// weight_offset + w), in one launch.
  bool add_rmsnorm = false;
  float weight_offset = 0.f;
};
OpCaseDef moe_combine_case(const MoeCombineShape& s);

struct SharedExpertGateShape {
  int tokens, hidden;
};
OpCaseDef shared_expert_gate_case(const SharedExpertGateShape& s);

// --- attention (cases_attention.cpp) --------------------------------------------------------

/// attention_decode_splits(num_seqs, n_kv_heads, max_kv_len, env.num_sms, kAttnMaxSplits), as
/// the engine picks it (kAttnMaxSplits: engine/cuda/step_chunk.h's kMaxAttnSplits).
constexpr int kSplitsAuto = -1;
constexpr int kAttnMaxSplits = 16;
/// A kv_lens entry for a sequence without keys (a decode token only): its output rows are zero.
constexpr int kEmptyContext = -1;

/// Sequence s has q_lens[s] new tokens at the end of kv_lens[s] positions; the cache is paged
/// (block_size) through a random permutation of physical blocks.
struct AttentionShape {
  int head_dim, n_q_heads, n_kv_heads;
  std::vector<int> q_lens, kv_lens;  ///< kv_lens entries 0 are drawn from [1, random_kv_max]
  int random_kv_max = 0;
  bool decode = false;               ///< attention_decode (else attention_prefill)
  int splits = 1;                    ///< or kSplitsAuto
  int q_pad = 8;                     ///< q rows are n_q_heads * head_dim + q_pad wide (fused qkv)
  /// max_kv_len (and block-table width) when above the longest context, as the engine's decode
  /// graphs pass their bucket: split ranges then reach past every sequence's end.
  int kv_bound = 0;
  int block_size = 16;  ///< cache block (the decode kernels step 16 keys in one block
                        ///< when it divides by 16, else look up every key)
  bool mma_sync = false;  ///< prefill off the wgmma kernel (AttentionPrefillKernel::mma_sync)
  /// AttentionParams::max_blocks (prefill at head_dim 128 on Hopper: the persistent kernel on at
  /// most this many blocks, so that each walks many work items); names the row " blocksN".
  int max_blocks = 0;
  /// Decode with AttentionParams::fused_rope (the warp kernel only: >= kWarpDecodeMinUnits
  /// (sequence, kv head) pairs, one split): q and the new tokens' k / v come raw in fused qkv
  /// rows (q_pad after them), normalised (with rope_norm) and rotated by the kernel, which also
  /// writes the new k / v to their cache slots; checked with the cache against fp64.
  bool fused_rope = false;
  bool rope_norm = true;
  /// Prefill with AttentionParams::rope_q: q raw in fused qkv rows (q_pad after them),
  /// normalised (with rope_norm) and rotated by attention_prefill at each token's position; on
  /// the persistent wgmma kernel also checked bit for bit against qk_norm_rope then attention.
  bool rope_q = false;
  /// AttentionParams::cluster_merge (decode, 2..8 splits): the splits merged across a cluster.
  bool cluster_merge = false;
};
OpCaseDef attention_case(const AttentionShape& s);

// --- MoE routing and expert GEMM (cases_moe.cpp) --------------------------------------------

struct RouterShape {
  int tokens, experts, top_k;
  bool renormalize = true;
  bool bf16_logits = false;  ///< logits rounded to bf16 and passed as bf16 (else fp32)
};
OpCaseDef router_case(const RouterShape& s);

/// Random distinct experts per token; with hot >= 0 every token also picks expert `hot`.
struct AlignShape {
  int tokens, experts, top_k;
  int hot = -1;
  int routings = 1;  ///< input sets run() rotates over
  /// Expert parallel (> 0): align only experts [expert0, expert0 + local_experts) of the
  /// routing's `experts`, under local ids; other pairs are dropped.
  int expert0 = 0, local_experts = 0;
  bool one_block = false;  ///< no workspace: the one-block align whatever the pair count
};
OpCaseDef align_case(const AlignShape& s);

/// Routing as AlignShape (aligned by moe_align in setup), then the sorted gather of a
/// [tokens, hidden] input (the many-token expert path).
struct GatherSortedShape {
  int tokens, experts, top_k, hidden;
  int hot = -1;
};
OpCaseDef gather_sorted_case(const GatherSortedShape& s);

struct RouteSmallShape {
  int tokens, experts, top_k, hidden;
  bool renormalize = true;
  /// Expert parallel (> 0): the router covers every expert, the align only experts
  /// [expert0, expert0 + local_experts), under local ids.
  int expert0 = 0, local_experts = 0;
  /// The MLP norm fused in front (RouteSmallNorm): x is the attention output added to a random
  /// residual, then normed; the case checks the residual, the normed rows and the routing of them.
  bool norm = false;
  /// RouteSmallParams::skip_align: the align's outputs are left as they were (poisoned) and not
  /// checked.
  bool skip_align = false;
  /// > 0: router row e is a copy of row e % tie_period, so those experts' logits tie exactly (each
  /// is one warp's sum in a fixed order) and the top-k must take the lower ids first.
  int tie_period = 0;
  /// RouteSmallParams::cluster: the cluster form (the case runs where it launches).
  bool cluster = false;
};
OpCaseDef route_small_case(const RouteSmallShape& s);

/// Which expert GEMM of the MoE block a case launches.
enum class MoeGemmStage {
  gate_up,       ///< in = x [tokens, H], W [E, 2I, H], out [pairs, 2I]
  gate_up_silu,  ///< same weights, out [pairs, I] = silu(gate) · up (the engine's path)
  down,          ///< in = act [pairs, I], W [E, H, I], out [pairs, H]
};

/// The expert-GEMM entry point a case calls: the library's moe_gemm, or a lab variant.
using MoeGemmKernel = void (*)(const kernels::MoeGemmParams&, cudaStream_t);

/// Routing as AlignShape (aligned by moe_align in setup), then one expert GEMM.
struct MoeGemmShape {
  int tokens, experts, top_k, hidden, inter;
  int hot = -1;
  MoeGemmStage stage = MoeGemmStage::gate_up;
  bool active_experts = false;  ///< grid over the experts with pairs (as the engine launches)
  int routings = 1;
  WeightFormat format = WeightFormat::bf16;  ///< of the stacked expert weights; names the row
  MoeGemmKernel kernel = &kernels::moe_gemm;
  const char* kernel_name = "moe_gemm";
  bool gemv = false;  ///< launch kernels::moe_gemv (tokens ≤ kMoeGemvMaxTokens) instead of `kernel`
  /// fp8_block only: W8A8, the input rows quantized per 1 × 128 by quantize_fp8_rows (in_fp8)
  bool w8a8 = false;
  /// bf16 or W8A8: kernels::moe_gemm_tma (Hopper) instead of `kernel`
  bool tma = false;
  /// moe_gemv of one token with MoeGemmParams::direct_topk (the experts from topk_ids)
  bool direct = false;
  /// moe_gemv on 4-bit weights with MoeGemmParams::gemv_cuda_cores (their CUDA-core walk
  /// instead of the tensor-core one)
  bool cuda_cores = false;
  /// down, one token (direct): kernels::moe_gemv_combine — the pairs' rows summed with random
  /// weights into a residual in place — checked bitwise against moe_gemv (CUDA-core walk) then
  /// moe_combine_add_rmsnorm on the GPU, and the sum against fp64
  bool combine = false;
};
OpCaseDef moe_gemm_case(const MoeGemmShape& s);

/// The many-token expert path after moe_align: the routed rows in sorted order (random rows
/// here, every row of every segment) times each expert's bf16 weights, by the wgmma kernel
/// (kernels/moe_wgmma.cuh) or by the cuBLAS grouped GEMM the engine falls back to (+ silu_mul
/// for gate_up_silu), with the offsets taken to the host at setup (the benchmark's peer).
struct SortedExpertGemmShape {
  int tokens, experts, top_k, hidden, inter;
  int hot = -1;
  MoeGemmStage stage = MoeGemmStage::gate_up_silu;  ///< gate_up_silu or down
  bool cublas = false;
  /// wgmma only: A rows gathered from the tokens' rows [tokens, k] through the sorted pair ids
  /// (the engine's gate+up stage), the pair → row map checked too.
  bool gather = false;
  /// wgmma only: W8A8 (kernels::moe_wgmma_fp8) on FP8-block weights and e4m3 rows
  bool fp8 = false;
  /// fp8 only: weights quantized in 128 × 128 blocks (weight_scale_rows 128, the cheaper promotion)
  bool block_scales = false;
  /// bf16 wgmma without gather only: the sorted rows brought by TMA (tma_rows)
  bool tma_rows = false;
  /// wgmma only: the persistent kernel's blocks (max_blocks of MoeWgmmaParams and
  /// MoeWgmmaFp8Params; 0 = one per SM)
  int max_blocks = 0;
};
OpCaseDef sorted_expert_gemm_case(const SortedExpertGemmShape& s);

// --- dense GEMM and sampling (cases_sampling_gemm.cpp) --------------------------------------

/// kernels::linear: out [m, n] = x [m, k] · W [n, k]ᵀ through cuBLAS.
struct LinearShape {
  int m, n, k;
  bool fp32_out = false;
  float w_scale = 0.1f;
  WeightFormat format = WeightFormat::bf16;
};
OpCaseDef linear_case(const LinearShape& s);

struct GreedyShape {
  int batch, vocab;
  bool plant_tie = false;  ///< row 2 gets two equal maxima (ids 777, 90000): the lower must win
};
OpCaseDef sample_greedy_case(const GreedyShape& s);

/// One row's sampling controls (seed and step are drawn per row in setup).
struct SamplingControls {
  float temperature, top_p;
  int top_k;
};

struct TopKTopPShape {
  int batch, vocab;
  std::vector<SamplingControls> controls;  ///< cycled over the rows
  bool quantize_rows = false;  ///< rows 3 and 7 on a grid of 1/4 and 1/2: ties at the top-k cut
};
OpCaseDef top_k_top_p_case(const TopKTopPShape& s);

/// Host rows of sample_top_k_top_p uploaded once; params() points a launch at them.
class SamplingInputs {
 public:
  SamplingInputs(const std::vector<float>& logits, const std::vector<float>& temperature,
                 const std::vector<int32_t>& top_k, const std::vector<float>& top_p,
                 const std::vector<uint64_t>& seeds, const std::vector<uint64_t>& steps);
  kernels::SamplingParams params(int32_t* out_tokens) const;

 private:
  int batch_, vocab_;
  DevBuf<float> logits_, temperature_, top_p_;
  DevBuf<int32_t> top_k_;
  DevBuf<uint64_t> seeds_, steps_;
};

// --- compressed weights (cases_quant.cpp) ---------------------------------------------------

/// kernels::quant_linear: out [m, n] = x [m, k] · W [n, k]ᵀ with W in `format`, on the path
/// kernels::quant_linear_path picks (bf16 → cuBLAS, m ≤ 8 → decode GEMV, else dequantize +
/// cuBLAS). fp8 k % 16 (groups of 128, the last partial when k % 128 != 0), nvfp4 k % 32.
struct QuantLinearShape {
  int m, n, k;
  bool fp32_out = false;
  WeightFormat format = WeightFormat::fp8_block;
  float w_scale = 0.1f;
  /// run() rotates over device copies of W covering at least this many bytes (the benchmark:
  /// more than L2 holds, so a GEMV reads HBM); 0: one copy.
  int64_t rotate_bytes = 0;
  /// bf16 only, m ≤ 8: kernels::gemv_stream (the persistent bulk-copy GEMV, sm_90a: the row
  /// skips elsewhere) instead of quant_linear, against the same reference.
  bool stream = false;
};
OpCaseDef quant_linear_case(const QuantLinearShape& s);

/// kernels::gemv_stream_combine_norm: one token's pending MoE combine (top_k weighted rows) added
/// into the residual and normalised inside the GEMV (weight as weight_offset + w), times bf16
/// W [n, hidden].
struct GemvCombineNormShape {
  int top_k, hidden, n;
  float weight_offset = 0.f;
};
OpCaseDef gemv_combine_norm_case(const GemvCombineNormShape& s);
/// The path quant_linear takes for s ("gemv", "dequant+cuBLAS", "cuBLAS"), or "gemv_stream":
/// benchmark row names.
const char* quant_linear_path_name(const QuantLinearShape& s);

/// kernels::Fp8BlockGemm (cuBLASLt, block-scaled FP8) of x [m, k] bf16, quantized per 1 × 128
/// in run(), and bf16 weights [n, k] quantized in 128 × 128 blocks; m % 4, n % 128, k % 128 == 0.
struct Fp8BlockGemmShape {
  int m, n, k;
};
OpCaseDef fp8_block_gemm_case(const Fp8BlockGemmShape& s);

/// kernels::dequantize of a [rows, cols] matrix in `format` to bf16.
struct DequantizeShape {
  int rows, cols;
  WeightFormat format = WeightFormat::fp8_block;
};
OpCaseDef dequantize_case(const DequantizeShape& s);

/// kernels::quantize_fp8_rows / quantize_nvfp4_rows of random bf16 rows (row 1 all zero, a
/// group of row 2 scaled by 2^-30 and one of row 3 by 2^-17: zero and subnormal scales).
struct QuantizeShape {
  int rows, cols;
  WeightFormat format = WeightFormat::fp8_block;  ///< fp8_block, nvfp4 or int4
  int group = 128;                                ///< fp8 inputs per scale
  /// fp8 only: scales group-major with a pitch of rows + 3 (kernels::Fp8BlockGemm's activations)
  bool group_major = false;
};
OpCaseDef quantize_case(const QuantizeShape& s);

// --- linear attention: Gated DeltaNet (cases_linear_attention.cpp) -------------------------

/// One rank's Gated DeltaNet heads and a step of sequences over them (kernels::GdnDims sizes).
/// Sequence s has q_lens[s] tokens from position first_pos[s % size]: position 0 starts from a
/// zero state (its slot holds random values the kernel must ignore), any other continues the
/// slot's random state. Slots are a random permutation of num_seqs + 3; the spare slots must stay
/// untouched. The in_proj rows have 8 elements of padding (proj_stride).
struct GdnStepShape {
  int nk, nv, dk, dv;
  int conv_kernel = 4;
  std::vector<int> q_lens;     ///< tokens per sequence (0: an empty sequence, nothing touched)
  std::vector<int> first_pos;  ///< cycled over the sequences
  int pad_seq = -1;            ///< this sequence gets state slot -1 (padding: zero state, not written)
  bool decode = false;         ///< the decode kernel (else the prefill one; both take any batch)
  /// Prefill: the delta rule's form (by_length: the engine's per-sequence pick); names the row.
  kernels::DeltaRuleForm form = kernels::DeltaRuleForm::by_length;
};
/// causal_conv_decode / causal_conv_prefill: out vs fp64 (5e-3), the new conv state bit-exact.
OpCaseDef causal_conv_case(const GdnStepShape& s);
/// gated_delta_rule_decode / _prefill: o vs fp64 (5e-3), the written state within 1e-4, the
/// other slots bit-exact.
OpCaseDef gated_delta_rule_case(const GdnStepShape& s);

struct GatedRmsNormShape {
  int tokens, nk, nv, dk, dv;
  bool in_place = false;  ///< out aliases o
};
OpCaseDef gated_rmsnorm_case(const GatedRmsNormShape& s);

}  // namespace moebatch::ops
