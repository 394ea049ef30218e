// The CUDA forward of Qwen3-MoE / Qwen2-MoE / Qwen3 for one rank, read top to bottom, mirroring
// engine/cpu/forward.cpp: embed → per layer [norm → qkv (+bias) → q/k norm + rope → kv write →
// attention → o_proj → residual + norm → router + experts (+shared expert) or dense MLP] →
// residual + final norm; then lm_head on the rows that need logits. bf16 storage, fp32 math
// inside every kernel. The residual stream is bf16 (rounded after each add, as in HF bf16).
// Every launch goes to one stream and reads fixed buffer addresses, so a decode step can be
// captured into a CUDA graph as is.
#include <cmath>

#include "engine/cuda/cuda_model.h"
#include "kernels/attention.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_ops.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"

namespace moebatch {
namespace {

namespace k = kernels;

void mark(StageTimer* t, const char* stage, cudaStream_t st) {
  if (t) t->mark(stage, st);
}

// SwiGLU MLP o[n, H] = down(silu(gate h) * up h) through cuBLAS (dense layers, shared expert).
void swiglu(CudaRank& r, const bf16* in, int n, int H, const DeviceTensor& gate_up,
            const DeviceTensor& down, int inter, bf16* out, cudaStream_t st) {
  StepBuffers& B = r.buf;
  k::linear(r.cublas, st, B.gate_up, in, gate_up.ptr, n, 2 * inter, H);
  k::silu_mul(B.act, B.gate_up, n, inter, st);
  k::linear(r.cublas, st, out, B.act, down.ptr, n, H, inter);
}

// Routed experts (+ shared expert with its sigmoid gate): B.o = MoE(B.h).
void moe(const ModelConfig& cfg, CudaRank& r, const DeviceLayerWeights& L, int n,
         cudaStream_t st, StageTimer* tm) {
  StepBuffers& B = r.buf;
  const int H = static_cast<int>(cfg.hidden_size), E = static_cast<int>(cfg.num_experts);
  const int topk = static_cast<int>(cfg.num_experts_per_tok);
  const int Ie = static_cast<int>(r.dims.moe_intermediate);
  const int pairs = n * topk;

  // router top-k: fp32 logits, softmax over all experts, top-k (+ renormalize)
  k::RouterParams rp;
  rp.topk_ids = B.topk_ids;
  rp.topk_weights = B.topk_weights;
  rp.tokens = n;
  rp.num_experts = E;
  rp.top_k = topk;
  rp.renormalize = cfg.norm_topk_prob;
  // align: (token, j) pairs grouped by expert, segments padded to the GEMM tile
  k::AlignParams ap;
  ap.sorted_ids = B.sorted_ids;
  ap.expert_offsets = B.expert_offsets;
  ap.topk_ids = B.topk_ids;
  ap.num_pairs = pairs;
  ap.num_experts = E;
  ap.block_m = k::kMoeGemmTileM;
  ap.active_experts = B.active_experts;
  if (n <= k::kRouteSmallMaxTokens) {
    // decode batches: GEMM, top-k and align in one launch
    k::RouteSmallParams sp;
    sp.router = rp;
    sp.align = ap;
    sp.x = B.h;
    sp.weight = L.router.ptr;
    sp.logits = B.router_logits;
    sp.hidden = H;
    sp.counter = B.route_counter;
    k::moe_route_small(sp, st);
    mark(tm, "router_align", st);
  } else {
    k::linear(r.cublas, st, B.router_logits, B.h, L.router.ptr, n, E, H);
    k::moe_router_topk(rp, B.router_logits, st);
    mark(tm, "router", st);
    k::moe_align(ap, st);
    mark(tm, "moe_align", st);
  }

  // experts: grouped gate+up GEMM with SiLU·mul in its epilogue (input row = pair / top_k),
  // then the grouped down GEMM
  k::MoeGemmParams gp;
  gp.out = B.act;
  gp.in = B.h;
  gp.weight = L.w_gate_up.ptr;
  gp.sorted_ids = B.sorted_ids;
  gp.expert_offsets = B.expert_offsets;
  gp.active_experts = B.active_experts;
  gp.num_pairs = pairs;
  gp.in_row_div = topk;
  gp.num_experts = E;
  gp.n = Ie;
  gp.k = H;
  gp.silu_gate_up = true;
  k::moe_gemm(gp, st);
  mark(tm, "moe_gemm_gate_up_silu", st);
  gp.out = B.expert_out;
  gp.in = B.act;
  gp.weight = L.w_down.ptr;
  gp.in_row_div = 1;
  gp.n = H;
  gp.k = Ie;
  gp.silu_gate_up = false;
  k::moe_gemm(gp, st);
  mark(tm, "moe_gemm_down", st);

  // combine: o[t] = Σ_j w[t, j] · y[t·k + j], in j order (batch independent)
  k::moe_combine(B.o, B.expert_out, B.topk_weights, n, topk, H, st);
  mark(tm, "moe_combine", st);

  // shared expert (Qwen2-MoE): o += sigmoid(h · g) · mlp(h)
  if (!L.shared_gate_up.empty()) {
    const int Is = static_cast<int>(r.dims.shared_intermediate);
    swiglu(r, B.h, n, H, L.shared_gate_up, L.shared_down, Is, B.expert_out, st);
    k::SharedExpertGateParams sp;
    sp.out = B.o;
    sp.moe_out = B.o;
    sp.shared_out = B.expert_out;
    sp.x = B.h;
    sp.gate_weight = L.shared_gate.ptr;
    sp.tokens = n;
    sp.hidden = H;
    k::shared_expert_gate(sp, st);
    mark(tm, "shared_expert", st);
  }
}

}  // namespace

void cuda_forward(const ModelConfig& cfg, CudaRank& r, const StepShape& s, cudaStream_t st,
                  StageTimer* tm) {
  const ShardDims& d = r.dims;
  const DeviceModelWeights& W = r.weights;
  StepBuffers& B = r.buf;
  const int n = s.tokens;
  const int H = static_cast<int>(cfg.hidden_size), hd = static_cast<int>(cfg.head_dim);
  const int nh = static_cast<int>(d.num_heads), nkv = static_cast<int>(d.num_kv_heads);
  const int qkv_width = (nh + 2 * nkv) * hd;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  MB_CHECK(n > 0 && n <= B.cap.tokens, "cuda_forward: token count outside the buffers");
  if (tm) tm->begin(st);

  // embed
  k::embedding_gather(B.x, W.embed.ptr, B.tokens, n, H, static_cast<int>(cfg.vocab_size), st);
  mark(tm, "embedding", st);

  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const DeviceLayerWeights& L = W.layers[l];

    // attention norm; from layer 1 on fused with the residual add of the previous MLP output
    k::RmsNormParams np;
    np.out = B.h;
    np.weight = L.input_norm.ptr;
    np.rows = n;
    np.cols = H;
    np.eps = eps;
    if (l == 0) {
      np.in = B.x;
      k::rmsnorm(np, st);
    } else {
      np.in = B.o;
      np.residual = B.x;
      k::add_rmsnorm(np, st);
    }
    mark(tm, "norm", st);

    // qkv projection: wq, wk, wv are consecutive rows of one [(nh + 2 nkv) hd, H] matrix
    // (the loader packs them), so one GEMM yields rows [q | k | v]; + bias for Qwen2-MoE
    k::linear(r.cublas, st, B.qkv, B.h, L.wq.ptr, n, qkv_width, H);
    if (!L.bq.empty()) k::add_bias(B.qkv, L.bq.ptr, n, qkv_width, st);
    mark(tm, "qkv_proj", st);

    // q/k per-head RMSNorm (Qwen3) + NEOX rope, in place inside the qkv rows, and the kv write
    // (every token's rotated k and its v into its paged slot) in the same launch, before anyone
    // attends
    k::QkNormRopeParams rp;
    rp.q = B.qkv;
    rp.k = B.qkv + nh * hd;
    rp.q_stride = qkv_width;
    rp.k_stride = qkv_width;
    rp.q_norm = L.q_norm.empty() ? nullptr : L.q_norm.ptr;
    rp.k_norm = L.k_norm.empty() ? nullptr : L.k_norm.ptr;
    rp.positions = B.positions;
    rp.tokens = n;
    rp.n_q_heads = nh;
    rp.n_kv_heads = nkv;
    rp.head_dim = hd;
    rp.theta = static_cast<float>(cfg.rope_theta);
    rp.eps = eps;
    rp.k_cache = r.kv.k(l);
    rp.v_cache = r.kv.v(l);
    rp.v = B.qkv + (nh + nkv) * hd;
    rp.v_stride = qkv_width;
    rp.slot_mapping = B.slots;
    k::qk_norm_rope(rp, st);
    mark(tm, "qk_norm_rope_kv_write", st);

    // attention over the paged cache: decode kernel (split-K) for one token per sequence,
    // prefill kernel for chunks and mixed steps
    k::AttentionParams at;
    at.out = B.attn;
    at.q = B.qkv;
    at.q_stride = qkv_width;
    at.k_cache = r.kv.k(l);
    at.v_cache = r.kv.v(l);
    at.block_tables = B.block_tables;
    at.q_start = B.q_start;
    at.kv_lens = B.kv_lens;
    at.num_seqs = s.seqs;
    at.num_tokens = n;
    at.max_q_len = s.max_q_len;
    at.max_kv_len = s.max_kv_len;
    at.max_blocks_per_seq = s.table_width;
    at.block_size = static_cast<int>(r.kv.block_size);
    at.n_q_heads = nh;
    at.n_kv_heads = nkv;
    at.head_dim = hd;
    at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (s.decode) {
      at.num_splits = s.attn_splits;
      at.workspace = B.attn_ws;
      k::attention_decode(at, st);
    } else {
      k::attention_prefill(at, st);
    }
    mark(tm, "attention", st);

    // o_proj, then residual add + post-attention norm in one kernel
    k::linear(r.cublas, st, B.o, B.attn, L.wo.ptr, n, H, nh * hd);
    mark(tm, "o_proj", st);
    np.in = B.o;
    np.residual = B.x;
    np.weight = L.post_norm.ptr;
    k::add_rmsnorm(np, st);
    mark(tm, "norm", st);

    // MLP: routed experts (+ shared expert) or dense SwiGLU, into B.o
    if (cfg.is_moe_layer(l)) {
      moe(cfg, r, L, n, st, tm);
    } else {
      swiglu(r, B.h, n, H, L.mlp_gate_up, L.mlp_down, static_cast<int>(d.intermediate), B.o, st);
      mark(tm, "dense_mlp", st);
    }
  }

  // last residual add + final norm (every row; the lm_head gathers the rows it needs)
  k::RmsNormParams fp;
  fp.out = B.h;
  fp.in = B.o;
  fp.residual = B.x;
  fp.weight = W.final_norm.ptr;
  fp.rows = n;
  fp.cols = H;
  fp.eps = eps;
  k::add_rmsnorm(fp, st);
  mark(tm, "norm", st);
}

void cuda_lm_head(const ModelConfig& cfg, CudaRank& r, int first, int rows, int tokens,
                  cudaStream_t st, StageTimer* tm) {
  StepBuffers& B = r.buf;
  const int H = static_cast<int>(cfg.hidden_size);
  MB_CHECK(rows > 0 && rows <= B.cap.logits_rows, "cuda_lm_head: rows outside the buffers");
  // gather the rows that need logits (the gather treats the normed states as a table)
  k::embedding_gather(B.xr, B.h, B.logits_rows + first, rows, H, tokens, st);
  k::linear(r.cublas, st, B.logits, B.xr, r.weights.lm_head.ptr, rows,
            static_cast<int>(r.dims.vocab), H);
  mark(tm, "lm_head", st);
}

}  // namespace moebatch
