// The CUDA forward of Qwen3-MoE / Qwen2-MoE / Qwen3 / Qwen3-Next for one rank, read top to
// bottom, mirroring engine/cpu/forward.cpp: embed → per layer [norm → token mixer: full attention
// (qkv (+bias) → q/k norm + rope + kv write → attention (→ output gate) → o_proj) or Gated
// DeltaNet (in_proj → conv + SiLU → delta rule → gated norm → out_proj) → (all-reduce +)
// residual + norm → MLP (router + experts (+shared expert) or dense)] → (all-reduce +) residual
// + final norm; then lm_head on the rows that need logits (+gather). bf16 storage, fp32 math
// inside every kernel; the residual stream is bf16
// (rounded after each add, as in HF bf16). Every launch goes to the rank's stream and reads
// fixed buffer addresses, so a decode step can be captured into a CUDA graph as is.
#include "engine/cuda/forward.h"

#include <cmath>
#include <optional>
#include <string>

#include "common/error.h"
#include "engine/cuda/linear.h"
#include "kernels/allreduce.cuh"
#include "kernels/attention.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/linear_attention.cuh"
#include "kernels/moe_sorted.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/moe_ops.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/quant.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"

namespace moebatch {
namespace {

namespace k = kernels;

// One forward call's constants: sizes, buffers and the kernel operands every layer shares,
// filled once from the StepShape; a layer copies an operand struct and sets its weights and
// cache pointers.
struct Step {
  CudaRank& r;
  StepBuffers& B;
  cudaStream_t st;
  StageTimer* tm;
  GemmContext gemm;
  int n, H;                        // tokens of the call, hidden size
  bool decode;                     // one query token per sequence: decode attention
  k::RmsNormParams norm;           // B.h = norm(in (+ B.x)); in, residual, weight per call
  k::QkNormRopeParams rope;        // q/k/v inside B.qkv rows; norms and cache per layer
  k::AttentionParams attn;         // B.qkv → B.attn over the paged cache; cache per layer
  int gate_offset = -1;            // column of the output gate in B.qkv rows (−1: no gate)
  k::GdnSeqs gdn_seqs;             // Gated DeltaNet: the call's sequences and state slots
  k::GdnDims gdn;                  // its local sizes
  k::RouteSmallParams route;       // router + top-k + align (≤ 8 tokens); weight per layer
  k::MoeGemmParams gate_up, down;  // expert GEMM operands; weights per layer
  k::MoeCombineParams combine;     // weighted sum over top-k (this rank's experts only with EP)

  Step(const ModelConfig& cfg, CudaRank& rank, const StepShape& s, StageTimer* timer)
      : r(rank), B(rank.buf), st(rank.stream), tm(timer), gemm(rank.gemm()) {
    const ShardDims& d = r.dims;
    n = s.tokens;
    H = static_cast<int>(cfg.hidden_size);
    decode = s.decode;
    const int hd = static_cast<int>(cfg.head_dim);
    const int nh = static_cast<int>(d.num_heads), nkv = static_cast<int>(d.num_kv_heads);
    // fused qkv rows: q | k | v, then with an output gate (Qwen3-Next) one gate per q head
    const int qkv_width = ((cfg.attn_output_gate ? 2 : 1) * nh + 2 * nkv) * hd;
    if (cfg.attn_output_gate) gate_offset = (nh + 2 * nkv) * hd;
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    // Qwen3-Next's norms apply their weight as 1 + w
    const float norm_offset = cfg.zero_centred_norm ? 1.f : 0.f;

    norm = {.out = B.h, .rows = n, .cols = H, .eps = eps, .weight_offset = norm_offset};
    rope = {.q = B.qkv, .k = B.qkv + nh * hd, .q_stride = qkv_width, .k_stride = qkv_width,
            .positions = B.positions, .rotation = B.rope_rotation, .tokens = n,
            .n_q_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
            .rotary_dim = static_cast<int>(cfg.rotary_dim), .theta = static_cast<float>(cfg.rope_theta),
            .eps = eps, .norm_offset = norm_offset,
            .v = B.qkv + (nh + nkv) * hd, .v_stride = qkv_width, .slot_mapping = B.slots,
            .trigger_early = r.pdl_trigger_early};
    attn = {.out = B.attn, .q = B.qkv, .q_stride = qkv_width, .block_tables = B.block_tables,
            .q_start = B.q_start, .kv_lens = B.kv_lens, .num_seqs = s.seqs, .num_tokens = n,
            .max_q_len = s.max_q_len, .max_kv_len = s.max_kv_len,
            .max_blocks_per_seq = s.table_width, .block_size = static_cast<int>(r.kv.block_size),
            .n_q_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
            .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
            .prefill_kernel = r.wgmma_attention ? k::AttentionPrefillKernel::best : k::AttentionPrefillKernel::mma_sync,
            .trigger_early = r.pdl_trigger_early, .cluster_merge = r.cluster_attention_merge};
    if (decode) {  // split-K over the key range, partials in the workspace
      attn.num_splits = s.attn_splits;
      attn.workspace = B.attn_ws;
    }

    // Gated DeltaNet: one sequence per attention sequence, each with its state slot
    if (cfg.num_linear_layers() > 0) {
      const LinearAttentionDims& la = cfg.linear;
      gdn_seqs = {.q_start = B.q_start, .positions = B.positions, .state_slots = B.state_slots,
                  .num_seqs = s.seqs};
      gdn = {.nk = static_cast<int>(d.lin_k_heads), .nv = static_cast<int>(d.lin_v_heads),
             .dk = static_cast<int>(la.k_head_dim), .dv = static_cast<int>(la.v_head_dim),
             .conv_kernel = static_cast<int>(la.conv_kernel)};
    }

    // router: fp32 logits, softmax over all experts, top-k (+ renormalize); align: (token, j)
    // pairs grouped by expert, segments padded to the GEMM tile. Expert parallel: every rank
    // routes over all E experts; align keeps the pairs of its El experts [e0, e0 + El) under
    // local ids, so other ranks' pairs cost no GEMM rows (El = E, e0 = 0 otherwise).
    const int E = static_cast<int>(cfg.num_experts);
    const int El = static_cast<int>(d.num_experts), e0 = static_cast<int>(d.expert0);
    const int topk = static_cast<int>(cfg.num_experts_per_tok);
    const int pairs = n * topk;
    route = {.router = {.topk_ids = B.topk_ids, .topk_weights = B.topk_weights, .tokens = n,
                        .num_experts = E, .top_k = topk, .renormalize = cfg.norm_topk_prob},
             .align = {.sorted_ids = B.sorted_ids, .expert_offsets = B.expert_offsets,
                       .topk_ids = B.topk_ids, .num_pairs = pairs, .num_experts = El,
                       .block_m = k::kMoeGemmTileM, .active_experts = B.active_experts,
                       .expert0 = e0, .workspace = B.align_ws},
             .x = B.h, .logits = B.router_logits, .hidden = H, .counter = B.route_counter, .norm = {},
             .trigger_early = r.pdl_trigger_early};

    // experts: gate+up with SiLU·mul in its epilogue (input row = pair / top_k), then down
    const int Ie = static_cast<int>(d.moe_intermediate);
    gate_up = {.out = B.act, .in = B.h, .weight = {}, .sorted_ids = B.sorted_ids,
               .expert_offsets = B.expert_offsets, .active_experts = B.active_experts,
               .num_pairs = pairs, .in_row_div = topk, .num_experts = El, .n = Ie, .k = H,
               .silu_gate_up = true};
    down = gate_up;
    down.out = B.expert_out;
    down.in = B.act;
    down.in_row_div = 1;
    down.n = H;
    down.k = Ie;
    down.silu_gate_up = false;
    // The routing is two launches back when down runs (gate+up in between): the decode GEMV
    // starts its weight loads while gate+up finishes.
    down.routing_settled = true;
    gate_up.gemv_cuda_cores = down.gemv_cuda_cores = !r.mma_expert_gemv;
    // One token (its grouped GEMV): both expert GEMVs take the experts straight from topk_ids,
    // one load where the align's lists take three before the first weight load, and then
    // nothing reads the lists: the router stops after its top-k.
    if (n == 1 && El == E) {
      gate_up.sorted_ids = down.sorted_ids = B.topk_ids;
      gate_up.direct_topk = down.direct_topk = true;
      route.skip_align = true;
    }

    // combine in j order; with EP only this rank's pairs (the others' rows were never written)
    combine = {.out = B.o, .expert_out = B.expert_out, .weights = B.topk_weights, .tokens = n,
               .top_k = topk, .hidden = H};
    if (El < E) {
      combine.topk_ids = B.topk_ids;
      combine.expert0 = e0;
      combine.num_local = El;
    }
  }

  void mark(const char* stage) const {
    if (tm) tm->mark(stage, st);
  }
};

// h = rmsnorm(x) · w, or with a branch output: x += branch (bf16), then h = rmsnorm(x) · w.
// With world > 1 the branch is this rank's partial (row-parallel o_proj, split MLP), summed over
// the ranks first: in the same launch as the add and the norm through the peer-to-peer
// all-reduce when the message fits its workspace, else NCCL in place before the add + norm.
// With a pending combine (one rank, routed experts only: moe() left B.o unformed) the branch is
// that combine's sum, formed in the same launch as the add and the norm (top_k 0: the down GEMV
// already added it into B.x, the norm alone).
void norm(const Step& s, bf16* branch, const DeviceTensor& w,
          std::optional<k::MoeCombineParams>& pending) {
  k::RmsNormParams p = s.norm;
  p.weight = w.as_bf16();
  if (pending) {
    p.residual = s.B.x;
    k::moe_combine_add_rmsnorm(*pending, p, s.st);
    pending.reset();
    s.mark("moe_combine_add_norm");
    return;
  }
  if (!branch) {
    p.in = s.B.x;
    k::rmsnorm(p, s.st);
    s.mark("norm");
    return;
  }
  p.in = branch;
  p.residual = s.B.x;
  if (s.r.world > 1) {
    const size_t count = static_cast<size_t>(s.n) * s.H;
    if (s.r.p2p && s.r.p2p->fits(count * sizeof(bf16))) {
      k::allreduce_add_rmsnorm(*s.r.p2p, s.r.rank, p, s.st);
      s.mark("all_reduce_add_norm");
      return;
    }
    s.r.comm->all_reduce_sum(s.r.rank, branch, count, CommDType::Bf16, s.st);
    s.mark("all_reduce");
  }
  k::add_rmsnorm(p, s.st);
  s.mark("norm");
}

// Full attention of this rank's heads: B.o = o_proj(attention(qkv(B.h))), a partial sum over
// heads when world > 1. Every token's k/v go to its paged slot before anyone attends. With
// `combine_norm` the layer's norm was left to the qkv GEMV: it forms B.h's one row itself from
// that pending combine, the residual B.x and L.input_norm (combine_norm_in_qkv; or, with top_k 0,
// from B.x alone: combine_in_down).
void attention(const Step& s, const DeviceLayerWeights& L, const DeviceKvCache& kv, int64_t kv_layer,
               const k::MoeCombineParams* combine_norm = nullptr) {
  const StepBuffers& B = s.B;
  // qkv projection: one GEMM over the fused [(nh + 2 nkv) hd, H] weight yields rows
  // [q | k | v]; + bias for Qwen2-MoE
  if (combine_norm != nullptr) {
    k::RmsNormParams n = s.norm;
    n.residual = B.x;
    n.weight = L.input_norm.as_bf16();
    k::gemv_stream_combine_norm(B.qkv, *combine_norm, n, B.norm_counter, L.wqkv.as_bf16(),
                                static_cast<int>(L.wqkv.shape[0]), s.H, s.st, s.r.pdl_trigger_early);
  } else {
    linear(s.gemm, B.qkv, B.h, L.wqkv, s.n);
  }
  if (!L.bqkv.empty())
    k::add_bias(B.qkv, L.bqkv.as_bf16(), s.n, static_cast<int>(L.bqkv.shape[0]), s.st);
  s.mark("qkv_proj");

  // q/k per-head RMSNorm (Qwen3) + NEOX rope, in place inside the qkv rows, and the kv write
  // in the same launch — or, in decode steps, inside the decode attention kernel (one launch
  // less per layer); in prefill steps q's part inside the attention (rope_q: q is written and
  // read once less)
  k::QkNormRopeParams rp = s.rope;
  rp.q_norm = L.q_norm.optional_bf16();
  rp.k_norm = L.k_norm.optional_bf16();
  rp.k_cache = kv.k(kv_layer);
  rp.v_cache = kv.v(kv_layer);
  k::AttentionParams at = s.attn;
  at.k_cache = kv.k(kv_layer);
  at.v_cache = kv.v(kv_layer);
  if (s.decode && s.r.fused_rope_attention) {
    at.rope = rp;
    at.fused_rope = k::attention_decode_fuses_rope(at);
  }
  if (!s.decode && s.r.prefill_rope_q) {
    at.rope = rp;
    at.rope_q = k::attention_prefill_rotates_q(at);  // elsewhere it would only be a launch of its own
    if (at.rope_q) rp.n_q_heads = 0;                  // the k heads and the cache write only
  }
  if (!at.fused_rope) {
    k::qk_norm_rope(rp, s.st);
    s.mark("qk_norm_rope_kv_write");
  }

  // attention over the paged cache: decode kernel (split-K) for one token per sequence,
  // prefill kernel for chunks and mixed steps
  if (s.decode) {
    k::attention_decode(at, s.st);
  } else {
    k::attention_prefill(at, s.st);
  }
  s.mark("attention");

  // output gate (Qwen3-Next): attn · sigmoid(gate), the gate read from the qkv rows
  if (s.gate_offset >= 0) {
    k::sigmoid_gate_mul(B.attn, B.qkv + s.gate_offset, s.rope.q_stride, s.n,
                        s.attn.n_q_heads * s.attn.head_dim, s.st);
    s.mark("output_gate");
  }

  // o_proj (row-parallel when world > 1)
  linear(s.gemm, B.o, B.attn, L.wo, s.n);
  s.mark("o_proj");
}

// Gated DeltaNet of this rank's heads (Qwen3-Next): B.o = out_proj(gated_norm(delta_rule(
// conv(in_proj(B.h))))), a partial sum over heads when world > 1. Each sequence continues the
// conv and delta-rule state of its slot (from zero at position 0) and leaves it advanced.
void linear_attention(const Step& s, const DeviceLayerWeights& L, const DeviceLinearState& st,
                      int64_t lin_layer) {
  const StepBuffers& B = s.B;
  // in_proj: per key head q, k, v, z, then b and a per value head, in one GEMM; its rows are
  // B.lin_proj's row width
  const int64_t proj_width = L.lin_in.rows();
  linear(s.gemm, B.lin_proj, B.h, L.lin_in, s.n);
  s.mark("lin_in_proj");

  // causal depthwise conv + SiLU over the q | k | v channels
  const k::CausalConvParams cp = {.out = B.lin_mixed, .proj = B.lin_proj,
                                  .proj_stride = proj_width, .weight = L.lin_conv.as_bf16(),
                                  .conv_state = st.conv(lin_layer), .seqs = s.gdn_seqs,
                                  .dims = s.gdn};
  if (s.decode) {
    k::causal_conv_decode(cp, s.st);
  } else {
    k::causal_conv_prefill(cp, s.st);
  }
  s.mark("lin_conv");

  // gated delta rule → B.attn [n, nv·dv]
  const k::GatedDeltaRuleParams dp = {.out = B.attn, .mixed = B.lin_mixed, .proj = B.lin_proj,
                                      .proj_stride = proj_width,
                                      .a_log = L.lin_a_log.as_bf16(),
                                      .dt_bias = L.lin_dt_bias.as_bf16(),
                                      .ssm_state = st.ssm(lin_layer), .seqs = s.gdn_seqs,
                                      .dims = s.gdn};
  if (s.decode) {
    k::gated_delta_rule_decode(dp, s.st);
  } else {
    k::gated_delta_rule_prefill(dp, s.st);
  }
  s.mark("lin_delta_rule");

  // norm(o) · w · silu(z) per value head, in place, then the row-parallel out_proj
  k::gated_rmsnorm({.out = B.attn, .o = B.attn, .proj = B.lin_proj,
                    .proj_stride = proj_width, .weight = L.lin_norm.as_bf16(),
                    .num_tokens = s.n, .dims = s.gdn, .eps = s.norm.eps},
                   s.st);
  linear(s.gemm, B.o, B.attn, L.lin_out, s.n);
  s.mark("lin_out_proj");
}

// SwiGLU MLP out[n, H] = down(silu(gate h) · up h) through the GEMM dispatch (dense layers,
// shared expert).
void dense_mlp(const Step& s, const DeviceTensor& gate_up, const DeviceTensor& down, bf16* out) {
  const StepBuffers& B = s.B;
  linear(s.gemm, B.gate_up, B.h, gate_up, s.n);
  k::silu_mul(B.act, B.gate_up, s.n, static_cast<int>(gate_up.shape[0] / 2), s.st);
  linear(s.gemm, out, B.act, down, s.n);
}

// Where a MoE layer's weighted sum of expert rows is formed.
enum class CombineAt {
  Launch,    // its own launch, into B.o
  NextNorm,  // left pending, for the norm after it to form with the add (one rank, no shared expert)
  DownGemv,  // added into B.x by the one-token down GEMV; the next norm, pending with top_k 0,
             // taken by the next layer's qkv GEMV (one launch less a layer)
};

// Routed experts: B.o = Σ_j w[t, j] · expert_j(B.h[t]), or that weighted sum left pending
// (returned) where `at` says so. With `norm_weight` the router's launch first forms
// B.x += B.o and B.h = rmsnorm(B.x) · norm_weight (norm() did not).
std::optional<k::MoeCombineParams> moe(const Step& s, const DeviceLayerWeights& L, CombineAt at,
                                       const DeviceTensor* norm_weight) {
  const StepBuffers& B = s.B;
  // router top-k + align; decode batches do GEMM, top-k and align in one launch
  if (s.n <= k::kRouteSmallMaxTokens) {
    k::RouteSmallParams rp = s.route;
    rp.weight = L.router.as_bf16();
    rp.cluster = s.r.cluster_router;
    if (norm_weight)
      rp.norm = {.branch = B.o, .residual = B.x, .weight = norm_weight->as_bf16(), .out = B.h,
                 .eps = s.norm.eps, .weight_offset = s.norm.weight_offset};
    k::moe_route_small(rp, s.st);
    s.mark("router_align");
  } else {
    MB_CHECK(!norm_weight, "moe: the norm is fused into the small-batch router only");
    linear(s.gemm, B.router_logits, B.h, L.router, s.n);
    k::moe_router_topk(s.route.router, B.router_logits, s.st);
    s.mark("router");
    k::moe_align(s.route.align, s.st);
    s.mark("moe_align");
  }

  k::MoeCombineParams combine = s.combine;
  const int experts = s.gate_up.num_experts, pairs = s.gate_up.num_pairs;
  const int64_t min_rows = s.r.sorted_moe_min_rows;
  if (!s.decode && min_rows > 0 && pairs >= min_rows * experts) {
    // Many tokens (prefill): tensor-core GEMMs over each expert's rows in sorted order. On
    // Hopper: one wgmma launch per stage (per batch of decoded experts when compressed) that
    // reads the offsets on the device and gathers the tokens' rows itself. Otherwise the rows are
    // gathered first and each expert is one library GEMM, for which the offsets come to the host
    // (this path is never captured in a graph). Decode steps stay on the grouped decode GEMM,
    // faster at every batch measured (bench/RESULTS.md).
    const size_t act_bytes = B.gate_up_elems / 2 * sizeof(bf16);
    if (s.r.w8a8_experts && w8a8_experts(L.w_gate_up, L.w_down) &&
        fp8_rows_bytes(B.sorted_rows, s.gate_up.n) <= act_bytes) {
      // FP8-block experts as W8A8 on FP8 tensor cores: the tokens' rows quantized per 1 × 128
      // into gate_up (unused on this path), gate+up + SiLU·mul writing e4m3 activations and
      // their scales into act, then down.
      const Fp8Rows x = carve_fp8_rows(B.gate_up, B.gate_up_elems * sizeof(bf16), s.n, s.H);
      const Fp8Rows act = carve_fp8_rows(B.act, act_bytes, B.sorted_rows, s.gate_up.n);
      k::quantize_fp8_rows(B.h, s.n, s.H, k::kWgmmaFp8Group, x.data, x.scales, s.st);
      expert_gemm_wgmma_fp8(s.gemm,
                            {.out = act.data, .out_scales = act.scales, .in = x.data, .in_scales = x.scales,
                             .expert_offsets = B.expert_offsets, .num_experts = experts, .n = 2 * s.gate_up.n,
                             .k = s.H, .rows_cap = B.sorted_rows, .silu_gate_up = true,
                             .sorted_ids = B.sorted_ids, .num_pairs = pairs,
                             .in_row_div = s.gate_up.in_row_div, .row_of_pair = B.row_of_pair},
                            L.w_gate_up);
      s.mark("moe_gemm_gate_up_silu");
      expert_gemm_wgmma_fp8(s.gemm,
                            {.out = B.expert_out, .in = act.data, .in_scales = act.scales,
                             .expert_offsets = B.expert_offsets, .num_experts = experts, .n = s.H,
                             .k = s.gate_up.n, .rows_cap = B.sorted_rows},
                            L.w_down);
      s.mark("moe_gemm_down");
    } else if (s.r.wgmma_experts) {
      k::MoeWgmmaParams gate_up{.out = B.act, .in = B.h, .expert_offsets = B.expert_offsets,
                                .num_experts = experts, .n = 2 * s.gate_up.n, .k = s.H, .rows_cap = B.sorted_rows,
                                .silu_gate_up = true, .sorted_ids = B.sorted_ids, .num_pairs = pairs,
                                .in_row_div = s.gate_up.in_row_div, .row_of_pair = B.row_of_pair};
      expert_gemm_wgmma(s.gemm, gate_up, L.w_gate_up);
      s.mark("moe_gemm_gate_up_silu");
      expert_gemm_wgmma(s.gemm,
                        {.out = B.expert_out, .in = B.act, .expert_offsets = B.expert_offsets,
                         .num_experts = experts, .n = s.H, .k = s.gate_up.n, .rows_cap = B.sorted_rows,
                         // rows by cp.async: on the persistent kernel 18.7 vs 24.1 ms by TMA
                         // (H100, 8 × 1024 prefill; on the per-tile kernel TMA was 5–6% ahead)
                         .tma_rows = false},
                        L.w_down);
      s.mark("moe_gemm_down");
    } else {
      CUDA_CHECK(cudaMemcpyAsync(s.r.host_offsets, B.expert_offsets, (experts + 1) * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, s.st));
      k::moe_gather_sorted({.out = B.expert_out, .row_of_pair = B.row_of_pair, .in = B.h,
                            .sorted_ids = B.sorted_ids, .expert_offsets = B.expert_offsets,
                            .num_experts = experts, .num_pairs = pairs,
                            .in_row_div = s.gate_up.in_row_div, .hidden = s.H,
                            .rows_cap = B.sorted_rows},
                           s.st);
      CUDA_CHECK(cudaStreamSynchronize(s.st));
      const int32_t* off = s.r.host_offsets;
      s.mark("moe_gather");
      expert_gemm_sorted(s.gemm, B.gate_up, B.expert_out, L.w_gate_up, off, 0);
      k::silu_mul(B.act, B.gate_up, off[experts], s.gate_up.n, s.st);
      s.mark("moe_gemm_gate_up_silu");
      expert_gemm_sorted(s.gemm, B.expert_out, B.act, L.w_down, off, 1);
      s.mark("moe_gemm_down");
    }
    combine.row_of_pair = B.row_of_pair;
  } else {
    // experts: grouped gate+up GEMM with SiLU·mul in its epilogue, then the grouped down GEMM
    // (a grouped GEMV for one-token steps). FP8-block experts run W8A8 there too: the hidden
    // rows, then the activations, quantized per 1 × 128 into gate_up (unused on this path).
    k::MoeGemmParams gate_up = s.gate_up, down = s.down;
    const size_t scratch = B.gate_up_elems * sizeof(bf16);
    const bool a8 = s.r.w8a8_experts && expert_gemm_w8a8(L.w_gate_up, L.w_down, s.n) &&
                    fp8_rows_bytes(s.n, s.H) <= scratch && fp8_rows_bytes(pairs, s.gate_up.n) <= scratch;
    if (a8) {
      const Fp8Rows x = carve_fp8_rows(B.gate_up, scratch, s.n, s.H);
      k::quantize_fp8_rows(B.h, s.n, s.H, k::kMoeGemmA8Group, x.data, x.scales, s.st);
      gate_up.in_fp8 = x.data;
      gate_up.in_scales = x.scales;
    }
    expert_gemm(s.gemm, gate_up, L.w_gate_up, s.n);
    s.mark("moe_gemm_gate_up_silu");
    if (a8) {
      const Fp8Rows a = carve_fp8_rows(B.gate_up, scratch, pairs, s.gate_up.n);
      k::quantize_fp8_rows(down.in, pairs, s.gate_up.n, k::kMoeGemmA8Group, a.data, a.scales, s.st);
      down.in_fp8 = a.data;
      down.in_scales = a.scales;
    }
    // the down GEMV adds the combine into the residual itself (where it takes the stage); what
    // is left pending is the next norm alone (top_k 0: no expert rows to sum)
    if (at == CombineAt::DownGemv && expert_gemv_combine(s.gemm, down, L.w_down, B.x, B.topk_weights)) {
      s.mark("moe_gemv_down_combine");
      combine.top_k = 0;
      combine.expert_out = nullptr;
      return combine;
    }
    expert_gemm(s.gemm, down, L.w_down, s.n);
    s.mark("moe_gemm_down");
  }

  // combine: o[t] = Σ_j w[t, j] · y[t·k + j], in j order (batch independent); with expert
  // parallelism a partial sum over this rank's experts, completed by the MLP's all-reduce
  if (at != CombineAt::Launch) return combine;
  k::moe_combine(combine, s.st);
  s.mark("moe_combine");
  return std::nullopt;
}

// Shared expert (Qwen2-MoE): B.o += sigmoid(h · g) · mlp(h).
void shared_expert(const Step& s, const DeviceLayerWeights& L) {
  const StepBuffers& B = s.B;
  MB_CHECK(!L.shared_gate_up.empty(), "MoeShared layer without shared-expert weights");
  dense_mlp(s, L.shared_gate_up, L.shared_down, B.expert_out);
  k::shared_expert_gate({.out = B.o, .moe_out = B.o, .shared_out = B.expert_out, .x = B.h,
                         .gate_weight = L.shared_gate.as_bf16(), .tokens = s.n, .hidden = s.H},
                        s.st);
  s.mark("shared_expert");
}

// Whether layer l's qkv GEMV can form the norm before it from a pending combine
// (kernels::gemv_stream_combine_norm: full attention, its qkv on gemv_stream, one token).
bool qkv_forms_norm(const Step& s, const ModelConfig& cfg, const DeviceModelWeights& W, int64_t l) {
  return l < cfg.num_layers && cfg.layers[static_cast<size_t>(l)].mixer == MixerKind::FullAttention &&
         linear_on_gemv_stream(s.gemm, W.layers[static_cast<size_t>(l)].wqkv, s.n) &&
         k::gemv_stream_combine_norm_fits(s.H);
}

}  // namespace

void cuda_forward(const ModelConfig& cfg, CudaRank& r, const StepShape& shape, StageTimer* tm) {
  MB_CHECK(shape.tokens > 0 && shape.tokens <= r.buf.cap.tokens,
           "cuda_forward: token count outside the buffers");
  if (tm) tm->begin(r.stream);
  const Step s(cfg, r, shape, tm);
  const DeviceModelWeights& W = r.weights;
  StepBuffers& B = r.buf;
  // The routed experts' weighted sum, when it waits for the next norm to form it (one rank, no
  // shared expert: nothing else reads B.o in between).
  std::optional<k::MoeCombineParams> pending;
  const bool defer_combine = r.world == 1;

  // embed
  k::embedding_gather(B.x, W.embed.as_bf16(), B.tokens, s.n, s.H,
                      static_cast<int>(cfg.vocab_size), s.st);
  s.mark("embedding");
  // every attention layer rotates by the same positions: their (cos, sin) once per forward
  if (B.rope_rotation != nullptr) {
    k::rope_rotation_table(B.positions, s.n, k::rope_rotated_dims(s.rope.rotary_dim, s.rope.head_dim),
                           s.rope.theta, B.rope_rotation, s.st);
    s.mark("rope_rotation");
  }

  int64_t kv_layer = 0;   // index among the layers that keep a KV cache
  int64_t lin_layer = 0;  // index among the linear-attention layers (state arena)
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const LayerKind kind = cfg.layers[static_cast<size_t>(l)];
    const DeviceLayerWeights& L = W.layers[static_cast<size_t>(l)];

    // mixer norm; from layer 1 on fused with the all-reduce and residual add of the previous
    // MLP output — or, for one token's pending combine, formed inside the qkv GEMV (always when
    // the down GEMV already added the combine: each CTA then reads one row)
    const bool norm_in_qkv =
        pending && (r.combine_norm_in_qkv || pending->top_k == 0) && qkv_forms_norm(s, cfg, W, l);
    if (!norm_in_qkv) norm(s, l == 0 ? nullptr : B.o, L.input_norm, pending);

    // token mixer → B.o (this rank's partial when world > 1)
    switch (kind.mixer) {
      case MixerKind::FullAttention:
        attention(s, L, r.kv, kv_layer++, norm_in_qkv ? &*pending : nullptr);
        if (norm_in_qkv) pending.reset();  // formed by the qkv GEMV
        break;
      case MixerKind::LinearAttention:
        linear_attention(s, L, r.lin_state, lin_layer++);
        break;
    }

    // all-reduce + residual add + MLP norm; a one-token step of one rank's routed experts
    // leaves the add and the norm to the router's launch (one kernel boundary less per layer:
    // batch 1 −0.05 ms; at 4 tokens the same fusion measured 0.45 ms slower in graphs, though
    // faster eager — not understood yet, docs/design.md)
    const bool norm_in_router = kind.mlp != MlpKind::Dense && r.world == 1 && r.router_norm &&
                                s.n == 1 && k::moe_route_small_fuses_norm(s.n, s.H);
    if (!norm_in_router) norm(s, B.o, L.post_norm, pending);

    // MLP → B.o (this rank's partial when world > 1)
    switch (kind.mlp) {
      case MlpKind::Dense:
        dense_mlp(s, L.mlp_gate_up, L.mlp_down, B.o);
        s.mark("dense_mlp");
        break;
      case MlpKind::Moe: {
        // one token: in the down GEMV where the next qkv GEMV then takes the norm — elsewhere
        // the norm would stay a launch of its own and nothing is saved (NVFP4 / Int4 steps
        // measured 3% slower with the down GEMV off its tensor-core walk; bench/RESULTS.md)
        const CombineAt at = !defer_combine ? CombineAt::Launch
                             : r.combine_in_down && s.n == 1 && qkv_forms_norm(s, cfg, W, l + 1)
                                 ? CombineAt::DownGemv
                                 : CombineAt::NextNorm;
        pending = moe(s, L, at, norm_in_router ? &L.post_norm : nullptr);
        break;
      }
      case MlpKind::MoeShared:
        moe(s, L, CombineAt::Launch, norm_in_router ? &L.post_norm : nullptr);
        shared_expert(s, L);
        break;
    }
  }

  // all-reduce + last residual add + final norm (every row; the lm_head gathers the rows it
  // needs)
  norm(s, B.o, W.final_norm, pending);
}

void cuda_lm_head(const ModelConfig& cfg, CudaRank& r, int first, int rows, int tokens,
                  StageTimer* tm) {
  StepBuffers& B = r.buf;
  const int H = static_cast<int>(cfg.hidden_size);
  MB_CHECK(rows > 0 && rows <= B.cap.logits_rows, "cuda_lm_head: rows outside the buffers");
  // gather the rows that need logits (the gather treats the normed states as a table)
  k::embedding_gather(B.xr, B.h, B.logits_rows + first, rows, H, tokens, r.stream);
  linear(r.gemm(), B.logits_local, B.xr, r.weights.lm_head, rows);
  if (tm) tm->mark("lm_head", r.stream);
  if (r.dims.vocab_split) {
    // vocab-parallel: gather every rank's [rows, V/world] slice, then rank 0 (the one that
    // samples) interleaves the slices into [rows, V]
    const size_t Vl = static_cast<size_t>(r.dims.vocab), V = static_cast<size_t>(cfg.vocab_size);
    r.comm->all_gather(r.rank, B.logits_local, B.logits_gather, rows * Vl, CommDType::F32,
                       r.stream);
    if (r.rank == 0) {
      for (int w = 0; w < r.world; ++w) {
        CUDA_CHECK(cudaMemcpy2DAsync(B.logits + w * Vl, V * sizeof(float),
                                     B.logits_gather + w * rows * Vl, Vl * sizeof(float),
                                     Vl * sizeof(float), static_cast<size_t>(rows),
                                     cudaMemcpyDeviceToDevice, r.stream));
      }
    }
    if (tm) tm->mark("lm_head_gather", r.stream);
  }
}

}  // namespace moebatch
