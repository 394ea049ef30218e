#include "engine/cpu/gated_delta_net.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "engine/cpu/ops.h"

namespace moebatch {
namespace {

using Vec = std::vector<float>;

// transformers' l2norm epsilon for q and k (fixed, not rms_norm_eps).
constexpr double kL2NormEps = 1e-6;

// Token indices of each block_tables row of the batch, in batch order (= position order).
std::vector<std::vector<int64_t>> tokens_by_row(const StepBatch& b) {
  std::vector<std::vector<int64_t>> rows(b.block_tables.size() /
                                         static_cast<size_t>(b.max_blocks_per_seq));
  for (size_t t = 0; t < b.tokens.size(); ++t)
    rows[static_cast<size_t>(b.seq_index[t])].push_back(static_cast<int64_t>(t));
  return rows;
}

}  // namespace

HostLinearState::HostLinearState(const ModelConfig& cfg, const ShardDims& d, int64_t n) : slots(n) {
  const LinearStateFloats f = linear_state_floats(cfg, d);
  conv_floats = f.conv;
  ssm_floats = f.ssm;
  conv.resize(cfg.layers.size());
  ssm.resize(cfg.layers.size());
  for (size_t l = 0; l < cfg.layers.size(); ++l) {
    if (cfg.layers[l].mixer != MixerKind::LinearAttention) continue;
    conv[l].assign(static_cast<size_t>(slots * conv_floats), 0.0f);
    ssm[l].assign(static_cast<size_t>(slots * ssm_floats), 0.0f);
  }
}

void HostLinearState::reset(int32_t s) {
  MB_CHECK(s >= 0 && s < slots, "state slot out of range");
  for (auto& c : conv)
    if (!c.empty()) std::fill_n(c.begin() + s * conv_floats, conv_floats, 0.0f);
  for (auto& m : ssm)
    if (!m.empty()) std::fill_n(m.begin() + s * ssm_floats, ssm_floats, 0.0f);
}

int64_t HostLinearState::bytes() const {
  int64_t n = 0;
  for (const auto& c : conv) n += static_cast<int64_t>(c.size());
  for (const auto& m : ssm) n += static_cast<int64_t>(m.size());
  return n * static_cast<int64_t>(sizeof(float));
}

void gated_delta_net(const ModelConfig& cfg, const ShardDims& d, const LayerWeights& L,
                     ThreadPool& pool, const StepBatch& b, int64_t layer, HostLinearState& st,
                     const float* x, float* y) {
  const LinearAttentionDims& a = cfg.linear;
  const int64_t n = static_cast<int64_t>(b.tokens.size()), H = cfg.hidden_size;
  const int64_t dk = a.k_head_dim, dv = a.v_head_dim, K = a.conv_kernel;
  const int64_t r = a.num_v_heads / a.num_k_heads, grp = 2 * dk + 2 * r * dv;
  const int64_t nk = d.lin_k_heads, nv = d.lin_v_heads;
  const int64_t C = 2 * nk * dk + nv * dv, P = nk * grp + 2 * nv;
  float* conv_state = st.conv[static_cast<size_t>(layer)].data();
  float* ssm_state = st.ssm[static_cast<size_t>(layer)].data();

  // in_proj: [qkvz | ba] in one GEMM, then regrouped from per-key-head groups into the conv's
  // channel order [q | k | v], the output gate z [nv, dv], and per value head beta and decay.
  Vec proj(static_cast<size_t>(n * P));
  cpu::matmul(pool, x, n, H, L.lin_in.ptr(), P, nullptr, proj.data());
  Vec mixed(static_cast<size_t>(n * C)), z(static_cast<size_t>(n * nv * dv));
  Vec beta(static_cast<size_t>(n * nv)), decay(beta.size());
  for (int64_t t = 0; t < n; ++t) {
    const float* row = proj.data() + t * P;
    float* m = mixed.data() + t * C;
    for (int64_t g = 0; g < nk; ++g) {
      const float* src = row + g * grp;
      std::copy_n(src, dk, m + g * dk);
      std::copy_n(src + dk, dk, m + nk * dk + g * dk);
      std::copy_n(src + 2 * dk, r * dv, m + 2 * nk * dk + g * r * dv);
      std::copy_n(src + 2 * dk + r * dv, r * dv, z.data() + (t * nv + g * r) * dv);
      const float* ba = row + nk * grp + g * 2 * r;
      for (int64_t j = 0; j < r; ++j) {
        const int64_t h = g * r + j;
        beta[t * nv + h] = cpu::sigmoid(ba[j]);
        // g = -exp(A_log) · softplus(a + dt_bias); the recurrence multiplies S by exp(g)
        const float gate =
            -std::exp(L.lin_a_log.ptr()[h]) * cpu::softplus(ba[r + j] + L.lin_dt_bias.ptr()[h]);
        decay[t * nv + h] = std::exp(gate);
      }
    }
  }

  // causal depthwise conv + SiLU, each sequence continuing from its slot's last K-1 inputs.
  // out[t] = Σ_j w[j] · in[t - (K-1) + j]; the window is the state (oldest first) then x_t.
  const auto rows = tokens_by_row(b);
  const auto nrows = static_cast<int64_t>(rows.size());
  Vec conv_out(mixed.size());
  pool.parallel_for(nrows * C, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t row = w / C, c = w % C;
      if (rows[row].empty()) continue;
      float* s = conv_state + (b.state_slots[row] * C + c) * (K - 1);
      const float* wc = L.lin_conv.ptr() + c * K;
      for (const int64_t t : rows[row]) {
        const float in = mixed[t * C + c];
        float acc = wc[K - 1] * in;
        for (int64_t j = 0; j + 1 < K; ++j) acc += wc[j] * s[j];
        for (int64_t j = 0; j + 2 < K; ++j) s[j] = s[j + 1];
        if (K > 1) s[K - 2] = in;
        conv_out[t * C + c] = cpu::silu(acc);
      }
    }
  });

  // q, k: L2-normalised per head; q scaled by 1/sqrt(dk)
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  for (int64_t t = 0; t < n; ++t) {
    float* q = conv_out.data() + t * C;
    cpu::l2norm(q, 2 * nk, dk, kL2NormEps);  // q heads then k heads, contiguous
    for (int64_t i = 0; i < nk * dk; ++i) q[i] *= q_scale;
  }

  // gated delta rule, token by token per (sequence, value head); value head h reads key head
  // h / r. S [dk, dv]:  S ← exp(g)·S;  delta = beta·(v − Sᵀk);  S ← S + k ⊗ delta;  o = Sᵀq.
  Vec o(static_cast<size_t>(n * nv * dv));
  pool.parallel_for(nrows * nv, [&](int64_t w0, int64_t w1) {
    Vec delta(static_cast<size_t>(dv));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t row = w / nv, h = w % nv, kh = h / r;
      if (rows[row].empty()) continue;
      float* S = ssm_state + (b.state_slots[row] * nv + h) * dk * dv;
      for (const int64_t t : rows[row]) {
        const float* q = conv_out.data() + t * C + kh * dk;
        const float* k = q + nk * dk;
        const float* v = conv_out.data() + t * C + 2 * nk * dk + h * dv;
        const float dec = decay[t * nv + h], bt = beta[t * nv + h];
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i) {
          float* Si = S + i * dv;
          for (int64_t j = 0; j < dv; ++j) {
            Si[j] *= dec;
            delta[j] += Si[j] * k[i];
          }
        }
        for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - delta[j]) * bt;
        float* out = o.data() + (t * nv + h) * dv;
        std::fill(out, out + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) {
          float* Si = S + i * dv;
          for (int64_t j = 0; j < dv; ++j) {
            Si[j] += k[i] * delta[j];
            out[j] += Si[j] * q[i];
          }
        }
      }
    }
  });

  // gated RMSNorm per value head (plain weight, not zero-centred): norm(o) · w · silu(z)
  cpu::rmsnorm(o.data(), L.lin_norm.ptr(), n * nv, dv, cfg.rms_norm_eps, o.data(), 0.0f);
  for (size_t i = 0; i < o.size(); ++i) o[i] *= cpu::silu(z[i]);

  // row-parallel out_proj: this rank's value heads
  cpu::matmul(pool, o.data(), n, nv * dv, L.lin_out.ptr(), H, nullptr, y);
}

}  // namespace moebatch
