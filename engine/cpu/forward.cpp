// The CPU reference forward of Qwen3-MoE / Qwen2-MoE / Qwen3 / Qwen3-Next for one
// tensor-parallel rank, read top to bottom: embed → per layer [norm → token mixer: full attention
// (qkv → q/k norm + rope → kv write → attention → output gate → o_proj) or Gated DeltaNet
// (engine/cpu/gated_delta_net.cpp) (+all-reduce) → residual → norm → router + experts (+shared
// expert) or dense MLP (+all-reduce) → residual] → final norm → lm_head (+gather). All math in
// fp32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gated_delta_net.h"
#include "engine/cpu/ops.h"

namespace moebatch {
namespace {

using Vec = std::vector<float>;

// Causal attention of every token over its own sequence's cached positions 0..position.
// q [n, nh, hd] → out [n, nh, hd]; query head h reads kv head h / group (GQA).
void paged_attention(ThreadPool& pool, const StepBatch& b, const HostKvCache& kv, int64_t layer,
                     const float* q, int64_t nh, float* out) {
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  const int64_t hd = kv.head_dim, nkv = kv.num_kv_heads, group = nh / nkv, bs = kv.block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* kc = kv.k[layer].data();
  const float* vc = kv.v[layer].data();
  pool.parallel_for(n * nh, [&](int64_t w0, int64_t w1) {
    Vec scores;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / nh, h = w % nh, kh = h / group;
      const int32_t* table = b.block_tables.data() + b.seq_index[t] * b.max_blocks_per_seq;
      const int64_t len = b.positions[t] + 1;
      const float* qh = q + (t * nh + h) * hd;
      scores.resize(static_cast<size_t>(len));
      float mx = -INFINITY;
      for (int64_t p = 0; p < len; ++p) {
        const int64_t slot = table[p / bs] * bs + p % bs;
        scores[p] = cpu::dot(qh, kc + (slot * nkv + kh) * hd, hd) * scale;
        mx = std::max(mx, scores[p]);
      }
      float sum = 0.0f;
      for (auto& s : scores) sum += (s = std::exp(s - mx));
      float* o = out + (t * nh + h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t p = 0; p < len; ++p) {
        const int64_t slot = table[p / bs] * bs + p % bs;
        const float* vp = vc + (slot * nkv + kh) * hd;
        const float wgt = scores[p] / sum;
        for (int64_t i = 0; i < hd; ++i) o[i] += wgt * vp[i];
      }
    }
  });
}

// SwiGLU MLP y[n, H] = down(silu(gate x) * up x), with gate/up stacked as [2I, H].
void swiglu(ThreadPool& pool, const float* x, int64_t n, int64_t H, const float* w_gate_up,
            const float* w_down, int64_t inter, float* y) {
  Vec gu(static_cast<size_t>(n * 2 * inter)), act(static_cast<size_t>(n * inter));
  cpu::matmul(pool, x, n, H, w_gate_up, 2 * inter, nullptr, gu.data());
  cpu::silu_mul(gu.data(), n, inter, act.data());
  cpu::matmul(pool, act.data(), n, inter, w_down, H, nullptr, y);
}

// Routed experts (+ shared expert): y[n, H] is this rank's partial sum.
void moe(const ModelConfig& cfg, const ShardDims& d, const LayerWeights& L, ThreadPool& pool,
         const float* x, int64_t n, float* y) {
  const int64_t H = cfg.hidden_size, E = cfg.num_experts, k = cfg.num_experts_per_tok;
  const int64_t Ie = d.moe_intermediate;
  // moegate: router logits → softmax → top-k (every rank routes identically).
  Vec logits(static_cast<size_t>(n * E)), wts(static_cast<size_t>(n * k));
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  cpu::matmul(pool, x, n, H, L.router.ptr(), E, nullptr, logits.data());
  for (int64_t t = 0; t < n; ++t) {
    cpu::route_topk(logits.data() + t * E, E, k, cfg.norm_topk_prob, ids.data() + t * k,
                    wts.data() + t * k);
  }
  // experts: gather each local expert's tokens, one gate_up GEMM and one down GEMM per expert.
  // Contributions are added in expert order so a token's sum is independent of the batch.
  std::fill(y, y + n * H, 0.0f);
  Vec xs, ys;
  std::vector<int64_t> tok;
  std::vector<float> tw;
  for (int64_t el = 0; el < d.num_experts; ++el) {
    const int32_t e = static_cast<int32_t>(d.expert0 + el);
    tok.clear();
    tw.clear();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (ids[t * k + j] == e) {
          tok.push_back(t);
          tw.push_back(wts[t * k + j]);
        }
      }
    }
    if (tok.empty()) continue;
    const int64_t m = static_cast<int64_t>(tok.size());
    xs.resize(static_cast<size_t>(m * H));
    ys.resize(static_cast<size_t>(m * H));
    for (int64_t i = 0; i < m; ++i)
      std::copy(x + tok[i] * H, x + (tok[i] + 1) * H, xs.data() + i * H);
    swiglu(pool, xs.data(), m, H, L.w_gate_up.ptr() + el * 2 * Ie * H, L.w_down.ptr() + el * H * Ie,
           Ie, ys.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t h = 0; h < H; ++h) y[tok[i] * H + h] += tw[i] * ys[i * H + h];
    }
  }
  // shared expert with sigmoid gate (Qwen2-MoE): y += sigmoid(x · g) * mlp(x).
  if (!L.shared_gate_up.empty()) {
    Vec s(static_cast<size_t>(n * H)), g(static_cast<size_t>(n));
    swiglu(pool, x, n, H, L.shared_gate_up.ptr(), L.shared_down.ptr(), d.shared_intermediate,
           s.data());
    cpu::matmul(pool, x, n, H, L.shared_gate.ptr(), 1, nullptr, g.data());
    for (int64_t t = 0; t < n; ++t) {
      const float sg = cpu::sigmoid(g[t]);
      for (int64_t h = 0; h < H; ++h) y[t * H + h] += sg * s[t * H + h];
    }
  }
}

// Full-attention mixer: y[n, H] is this rank's partial o_proj sum. With an output gate (Qwen3-
// Next) the fused rows end with a gate per q head and the attention output is multiplied by
// sigmoid(gate) before o_proj.
void attention(const ModelConfig& cfg, CpuRank& r, const StepBatch& b, int64_t l, const float* x,
               float* y) {
  const ShardDims& d = r.dims;
  const LayerWeights& L = r.weights.layers[l];
  ThreadPool& pool = *r.pool;
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  const int64_t H = cfg.hidden_size, hd = cfg.head_dim, nh = d.num_heads, nkv = d.num_kv_heads;
  const int64_t qm = cfg.attn_output_gate ? 2 : 1;  // q rows per head: query (+ gate)
  const float norm_off = cfg.zero_centred_norm ? 1.0f : 0.0f;
  const double eps = cfg.rms_norm_eps;

  // fused qkv projection (+ bias for Qwen2-MoE): rows [q | k | v (| gate)], split apart
  const int64_t qkv_width = (nh * qm + 2 * nkv) * hd;
  Vec qkv(static_cast<size_t>(n * qkv_width));
  Vec q(static_cast<size_t>(n * nh * hd)), gate(cfg.attn_output_gate ? q.size() : 0);
  Vec k(static_cast<size_t>(n * nkv * hd)), v(k.size()), attn(q.size());
  cpu::matmul(pool, x, n, H, L.wqkv.ptr(), qkv_width, L.bqkv.empty() ? nullptr : L.bqkv.ptr(),
              qkv.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* row = qkv.data() + t * qkv_width;
    std::copy_n(row, nh * hd, q.data() + t * nh * hd);
    std::copy_n(row + nh * hd, nkv * hd, k.data() + t * nkv * hd);
    std::copy_n(row + (nh + nkv) * hd, nkv * hd, v.data() + t * nkv * hd);
    if (qm == 2) std::copy_n(row + (nh + 2 * nkv) * hd, nh * hd, gate.data() + t * nh * hd);
  }

  // q/k per-head RMSNorm (Qwen3), then RoPE on the first rotary_dim dims of q and k
  if (!L.q_norm.empty()) {
    cpu::rmsnorm(q.data(), L.q_norm.ptr(), n * nh, hd, eps, q.data(), norm_off);
    cpu::rmsnorm(k.data(), L.k_norm.ptr(), n * nkv, hd, eps, k.data(), norm_off);
  }
  cpu::rope_neox(q.data(), b.positions.data(), n, nh, hd, cfg.rotary_dim, cfg.rope_theta);
  cpu::rope_neox(k.data(), b.positions.data(), n, nkv, hd, cfg.rotary_dim, cfg.rope_theta);

  // kv write: every token's k/v into its paged slot before anyone attends
  const int64_t stride = r.kv.slot_stride();
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(k.data() + t * stride, stride, r.kv.k[l].data() + b.slot_mapping[t] * stride);
    std::copy_n(v.data() + t * stride, stride, r.kv.v[l].data() + b.slot_mapping[t] * stride);
  }

  // attention over the paged cache, output gate, then row-parallel o_proj
  paged_attention(pool, b, r.kv, l, q.data(), nh, attn.data());
  for (size_t i = 0; i < gate.size(); ++i) attn[i] *= cpu::sigmoid(gate[i]);
  cpu::matmul(pool, attn.data(), n, nh * hd, L.wo.ptr(), H, nullptr, y);
}

}  // namespace

void cpu_forward(const ModelConfig& cfg, CpuRank& r, Communicator& comm, const StepBatch& b,
                 std::vector<float>& logits) {
  const ShardDims& d = r.dims;
  const ModelWeights& W = r.weights;
  ThreadPool& pool = *r.pool;
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  const int64_t H = cfg.hidden_size;
  const double eps = cfg.rms_norm_eps;
  const float norm_off = cfg.zero_centred_norm ? 1.0f : 0.0f;  // Qwen3-Next norms: x̂ · (1 + w)
  MB_CHECK(cfg.rotary_dim > 0 && cfg.rotary_dim <= cfg.head_dim && cfg.rotary_dim % 2 == 0,
           "model config: rotary_dim must be even and in (0, head_dim]");

  // embed
  Vec x(static_cast<size_t>(n * H)), h(x.size()), o(x.size());
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(W.embed.ptr() + b.tokens[t] * H, H, x.data() + t * H);
  }

  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const LayerWeights& L = W.layers[l];
    const LayerKind kind = cfg.layers[static_cast<size_t>(l)];

    // token mixer: full attention or Gated DeltaNet on the normed input, all-reduce, residual
    cpu::rmsnorm(x.data(), L.input_norm.ptr(), n, H, eps, h.data(), norm_off);
    if (kind.mixer == MixerKind::LinearAttention) {
      MB_CHECK(r.state != nullptr, "cpu forward: linear-attention layer without state slots");
      gated_delta_net(cfg, d, L, pool, b, l, *r.state, h.data(), o.data());
    } else {
      attention(cfg, r, b, l, h.data(), o.data());
    }
    comm.all_reduce_sum(r.rank, o.data(), o.size(), CommDType::F32, nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    // MLP norm, then routed experts or dense MLP, all-reduce, residual
    cpu::rmsnorm(x.data(), L.post_norm.ptr(), n, H, eps, h.data(), norm_off);
    if (kind.is_moe()) {
      moe(cfg, d, L, pool, h.data(), n, o.data());
    } else {
      swiglu(pool, h.data(), n, H, L.mlp_gate_up.ptr(), L.mlp_down.ptr(), d.intermediate, o.data());
    }
    comm.all_reduce_sum(r.rank, o.data(), o.size(), CommDType::F32, nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }

  // final norm on the rows that need logits, then lm_head (vocab-parallel: gather on rank 0)
  const int64_t rows = static_cast<int64_t>(b.logits_rows.size());
  if (rows == 0) {
    if (r.rank == 0) logits.clear();
    return;
  }
  Vec xr(static_cast<size_t>(rows * H));
  for (int64_t i = 0; i < rows; ++i) {
    cpu::rmsnorm(x.data() + b.logits_rows[i] * H, W.final_norm.ptr(), 1, H, eps, xr.data() + i * H,
                 norm_off);
  }
  Vec local(static_cast<size_t>(rows * d.vocab));
  cpu::matmul(pool, xr.data(), rows, H, W.lm_head.ptr(), d.vocab, nullptr, local.data());
  if (r.rank == 0) logits.resize(static_cast<size_t>(rows * cfg.vocab_size));
  if (d.vocab_split) {
    // every rank's [rows, vocab/world] block, then rank 0 lays them side by side per row
    const int world = comm.world();
    Vec all(local.size() * world);
    comm.all_gather(r.rank, local.data(), all.data(), local.size(), CommDType::F32, nullptr);
    if (r.rank == 0) {
      for (int k = 0; k < world; ++k)
        for (int64_t i = 0; i < rows; ++i)
          std::copy_n(all.data() + (k * rows + i) * d.vocab, d.vocab,
                      logits.data() + i * cfg.vocab_size + k * d.vocab);
    }
  } else if (r.rank == 0) {
    std::copy(local.begin(), local.end(), logits.begin());
  }
}

}  // namespace moebatch
