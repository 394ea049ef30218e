// Embedding, RMSNorm (+ residual), q/k norm + RoPE, KV cache write, SiLU·mul, MoE combine and
// the shared-expert gate against fp64 CPU references on fresh random inputs.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/embedding.cuh"
#include "kernels/kv_cache.cuh"
#include "kernels/moe_ops.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace moebatch::test {
namespace {

using namespace moebatch::kernels;

class ElementwiseTest : public GpuTest {};

TEST_F(ElementwiseTest, EmbeddingGatherCopiesRowsAndZeroesBadIds) {
  SCOPED_TRACE(trace());
  const int vocab = 1000, hidden = 264, tokens = 37;
  auto table = random_bf16(rng, static_cast<size_t>(vocab) * hidden, 1.f);
  std::vector<int32_t> ids(tokens);
  for (auto& id : ids) id = std::uniform_int_distribution<int>(0, vocab - 1)(rng);
  ids[5] = -1;
  ids[9] = vocab;
  DevBuf<bf16> d_table(table), d_out(static_cast<size_t>(tokens) * hidden);
  DevBuf<int32_t> d_ids(ids);
  d_out.poison();
  embedding_gather(d_out.get(), d_table.get(), d_ids.get(), tokens, hidden, vocab, stream);
  sync();
  const auto out = d_out.download<uint16_t>();
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < hidden; ++h) {
      const bool bad = ids[t] < 0 || ids[t] >= vocab;
      const uint16_t want = bad ? 0 : table[static_cast<size_t>(ids[t]) * hidden + h];
      ASSERT_EQ(out[static_cast<size_t>(t) * hidden + h], want) << "token " << t << " col " << h;
    }
}

// add = true: residual += x (bf16), out = norm(residual) * w.
void rmsnorm_case(GpuTest& ctx, std::mt19937& rng, cudaStream_t stream, int rows, int cols, bool add) {
  const float eps = 1e-6f;
  auto x = random_bf16(rng, static_cast<size_t>(rows) * cols, 2.f);
  auto res = random_bf16(rng, static_cast<size_t>(rows) * cols, 2.f);
  auto w = random_bf16(rng, cols, 1.5f);
  DevBuf<bf16> d_x(x), d_res(res), d_w(w), d_out(x.size());
  d_out.poison();
  RmsNormParams p;
  p.out = d_out.get();
  p.in = d_x.get();
  p.residual = add ? d_res.get() : nullptr;
  p.weight = d_w.get();
  p.rows = rows;
  p.cols = cols;
  p.eps = eps;
  if (add) add_rmsnorm(p, stream); else rmsnorm(p, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  (void)ctx;
  std::vector<double> ref(x.size());
  std::vector<float> new_res(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      const float v = add ? round_bf(bf2f(res[i]) + bf2f(x[i])) : bf2f(x[i]);
      new_res[i] = v;
      ss += static_cast<double>(v) * v;
    }
    const double rstd = 1.0 / std::sqrt(ss / cols + eps);
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      ref[i] = new_res[i] * rstd * bf2f(w[c]);
    }
  }
  // bf16 output: one rounding, ~2^-9 relative per element.
  EXPECT_TRUE(close_rel_l2(to_float(d_out.download<uint16_t>()), ref, 5e-3));
  if (add) {
    const auto got = to_float(d_res.download<uint16_t>());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], new_res[i]) << "residual " << i;
  }
}

TEST_F(ElementwiseTest, RmsNormMatchesReference) {
  SCOPED_TRACE(trace());
  rmsnorm_case(*this, rng, stream, 13, 2048, false);
  rmsnorm_case(*this, rng, stream, 5, 128, false);
}

TEST_F(ElementwiseTest, AddRmsNormUpdatesResidualAndNormalizes) {
  SCOPED_TRACE(trace());
  rmsnorm_case(*this, rng, stream, 13, 2048, true);
  rmsnorm_case(*this, rng, stream, 7, 136, true);
}

// With `cache`, the fused paged-cache write is checked too: rotated k and v land bit-exactly in
// their slots, padding tokens and other slots stay untouched.
void rope_case(std::mt19937& rng, cudaStream_t stream, int head_dim, bool norm, bool cache = false) {
  SCOPED_TRACE("head_dim " + std::to_string(head_dim) + (norm ? " with norm" : " no norm") +
               (cache ? " + cache write" : ""));
  const int tokens = 19, nq = 8, nkv = 4;
  const int width = (nq + 2 * nkv) * head_dim;  // fused qkv row: q, k, v
  const float theta = 1e6f, eps = 1e-6f;
  auto qkv = random_bf16(rng, static_cast<size_t>(tokens) * width, 3.f);
  auto qn = random_bf16(rng, head_dim, 1.5f), kn = random_bf16(rng, head_dim, 1.5f);
  std::vector<int32_t> pos(tokens);
  for (auto& v : pos) v = std::uniform_int_distribution<int>(0, 40000)(rng);
  pos[0] = 0;
  DevBuf<bf16> d_qkv(qkv), d_qn(qn), d_kn(kn);
  DevBuf<int32_t> d_pos(pos);
  QkNormRopeParams p;
  p.q = d_qkv.get();
  p.k = d_qkv.get() + nq * head_dim;
  p.q_stride = p.k_stride = width;
  p.q_norm = norm ? d_qn.get() : nullptr;
  p.k_norm = norm ? d_kn.get() : nullptr;
  p.positions = d_pos.get();
  p.tokens = tokens;
  p.n_q_heads = nq;
  p.n_kv_heads = nkv;
  p.head_dim = head_dim;
  p.theta = theta;
  p.eps = eps;
  const int kv_width = nkv * head_dim, num_slots = 3 * tokens;
  auto cache0 = random_bf16(rng, static_cast<size_t>(num_slots) * kv_width, 1.f);
  std::vector<int32_t> slots(num_slots);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(tokens);
  slots[2] = -1;  // padding token
  DevBuf<bf16> d_kc(cache0), d_vc(cache0);
  DevBuf<int32_t> d_slots(slots);
  if (cache) {
    p.k_cache = d_kc.get();
    p.v_cache = d_vc.get();
    p.v = d_qkv.get() + (nq + nkv) * head_dim;
    p.v_stride = width;
    p.slot_mapping = d_slots.get();
  }
  qk_norm_rope(p, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto got_bits = d_qkv.download<uint16_t>();
  const auto got = to_float(got_bits);
  if (cache) {
    auto want_k = cache0, want_v = cache0;
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int i = 0; i < kv_width; ++i) {
        const size_t row = static_cast<size_t>(t) * width;
        want_k[static_cast<size_t>(slots[t]) * kv_width + i] = got_bits[row + nq * head_dim + i];
        want_v[static_cast<size_t>(slots[t]) * kv_width + i] = qkv[row + (nq + nkv) * head_dim + i];
      }
    }
    EXPECT_EQ(d_kc.download<uint16_t>(), want_k) << "k cache";
    EXPECT_EQ(d_vc.download<uint16_t>(), want_v) << "v cache";
  }
  std::vector<double> ref(qkv.size());
  std::vector<float> rot_got;
  std::vector<double> rot_ref;
  const int half = head_dim / 2;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < nq + 2 * nkv; ++h) {
      const size_t base = static_cast<size_t>(t) * width + static_cast<size_t>(h) * head_dim;
      if (h >= nq + nkv) {  // v heads: untouched
        for (int d = 0; d < head_dim; ++d) ASSERT_EQ(got[base + d], bf2f(qkv[base + d]));
        continue;
      }
      const auto& w = h < nq ? qn : kn;
      double ss = 0;
      for (int d = 0; d < head_dim; ++d) ss += std::pow(static_cast<double>(bf2f(qkv[base + d])), 2);
      const double rstd = norm ? 1.0 / std::sqrt(ss / head_dim + eps) : 1.0;
      for (int i = 0; i < half; ++i) {
        double a = bf2f(qkv[base + i]) * rstd, b = bf2f(qkv[base + i + half]) * rstd;
        if (norm) { a *= bf2f(w[i]); b *= bf2f(w[i + half]); }
        const double ang = static_cast<double>(pos[t]) * std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
        rot_ref.push_back(a * std::cos(ang) - b * std::sin(ang));
        rot_ref.push_back(b * std::cos(ang) + a * std::sin(ang));
        rot_got.push_back(got[base + i]);
        rot_got.push_back(got[base + i + half]);
      }
    }
  }
  // bf16 rounding of the output plus fp32 angle error at positions up to 4e4 (~4e-3 rad).
  EXPECT_TRUE(close_rel_l2(rot_got, rot_ref, 8e-3));
}

TEST_F(ElementwiseTest, QkNormRopeMatchesReference) {
  SCOPED_TRACE(trace());
  rope_case(rng, stream, 128, true);
  rope_case(rng, stream, 32, true);
  rope_case(rng, stream, 16, false);
  rope_case(rng, stream, 128, true, true);
  rope_case(rng, stream, 64, false, true);
}

TEST_F(ElementwiseTest, KvCacheWriteScattersToSlotsOnly) {
  SCOPED_TRACE(trace());
  const int tokens = 45, nkv = 4, hd = 128, width = nkv * hd, num_slots = 16 * 12;
  const int64_t stride = 3 * width + 8 * 4;  // k/v inside a wider row, still 16-byte aligned
  auto kv = random_bf16(rng, static_cast<size_t>(tokens) * stride, 1.f);
  auto cache0 = random_bf16(rng, static_cast<size_t>(num_slots) * width, 1.f);
  std::vector<int32_t> perm(num_slots);
  for (int i = 0; i < num_slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(perm.begin(), perm.begin() + tokens);
  slots[3] = -1;  // padding token
  DevBuf<bf16> d_kv(kv), d_kc(cache0), d_vc(cache0);
  DevBuf<int32_t> d_slots(slots);
  KvCacheWriteParams p;
  p.k_cache = d_kc.get();
  p.v_cache = d_vc.get();
  p.k = d_kv.get() + width;
  p.v = d_kv.get() + 2 * width;
  p.k_stride = p.v_stride = stride;
  p.slot_mapping = d_slots.get();
  p.tokens = tokens;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  kv_cache_write(p, stream);
  sync();
  auto want_k = cache0, want_v = cache0;
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int i = 0; i < width; ++i) {
      want_k[static_cast<size_t>(slots[t]) * width + i] = kv[t * stride + width + i];
      want_v[static_cast<size_t>(slots[t]) * width + i] = kv[t * stride + 2 * width + i];
    }
  }
  EXPECT_EQ(d_kc.download<uint16_t>(), want_k);
  EXPECT_EQ(d_vc.download<uint16_t>(), want_v);
}

TEST_F(ElementwiseTest, SiluMulMatchesReference) {
  SCOPED_TRACE(trace());
  const int rows = 33, inter = 768;
  auto in = random_bf16(rng, static_cast<size_t>(rows) * 2 * inter, 4.f);
  DevBuf<bf16> d_in(in), d_out(static_cast<size_t>(rows) * inter);
  d_out.poison();
  silu_mul(d_out.get(), d_in.get(), rows, inter, stream);
  sync();
  std::vector<double> ref(d_out.size());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < inter; ++i) {
      const double g = bf2f(in[static_cast<size_t>(r) * 2 * inter + i]);
      const double u = bf2f(in[static_cast<size_t>(r) * 2 * inter + inter + i]);
      ref[static_cast<size_t>(r) * inter + i] = g / (1 + std::exp(-g)) * u;
    }
  EXPECT_TRUE(close_rel_l2(to_float(d_out.download<uint16_t>()), ref, 5e-3));
}

TEST_F(ElementwiseTest, MoeCombineWeightsAndSumsTopK) {
  SCOPED_TRACE(trace());
  const int tokens = 21, top_k = 8, hidden = 2048;
  auto y = random_bf16(rng, static_cast<size_t>(tokens) * top_k * hidden, 2.f);
  std::vector<float> w(static_cast<size_t>(tokens) * top_k);
  for (auto& v : w) v = std::uniform_real_distribution<float>(0.f, 1.f)(rng);
  DevBuf<bf16> d_y(y), d_out(static_cast<size_t>(tokens) * hidden);
  DevBuf<float> d_w(w);
  for (bool weighted : {true, false}) {
    d_out.poison();
    moe_combine(d_out.get(), d_y.get(), weighted ? d_w.get() : nullptr, tokens, top_k, hidden, stream);
    sync();
    std::vector<double> ref(d_out.size(), 0.0);
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j < top_k; ++j)
        for (int h = 0; h < hidden; ++h)
          ref[static_cast<size_t>(t) * hidden + h] +=
              (weighted ? w[t * top_k + j] : 1.0) * bf2f(y[(static_cast<size_t>(t) * top_k + j) * hidden + h]);
    EXPECT_TRUE(close_rel_l2(to_float(d_out.download<uint16_t>()), ref, 5e-3)) << "weighted " << weighted;
  }
}

TEST_F(ElementwiseTest, SharedExpertGateAddsSigmoidGatedOutput) {
  SCOPED_TRACE(trace());
  const int tokens = 17, hidden = 2048;
  auto moe = random_bf16(rng, static_cast<size_t>(tokens) * hidden, 1.f);
  auto shared = random_bf16(rng, moe.size(), 1.f);
  auto x = random_bf16(rng, moe.size(), 1.f);
  auto gw = random_bf16(rng, hidden, 0.05f);
  DevBuf<bf16> d_moe(moe), d_shared(shared), d_x(x), d_gw(gw), d_out(moe.size());
  d_out.poison();
  SharedExpertGateParams p;
  p.out = d_out.get();
  p.moe_out = d_moe.get();
  p.shared_out = d_shared.get();
  p.x = d_x.get();
  p.gate_weight = d_gw.get();
  p.tokens = tokens;
  p.hidden = hidden;
  shared_expert_gate(p, stream);
  sync();
  std::vector<double> ref(moe.size());
  for (int t = 0; t < tokens; ++t) {
    double dot = 0;
    for (int h = 0; h < hidden; ++h) dot += static_cast<double>(bf2f(x[static_cast<size_t>(t) * hidden + h])) * bf2f(gw[h]);
    const double g = 1.0 / (1.0 + std::exp(-dot));
    for (int h = 0; h < hidden; ++h) {
      const size_t i = static_cast<size_t>(t) * hidden + h;
      ref[i] = bf2f(moe[i]) + g * bf2f(shared[i]);
    }
  }
  EXPECT_TRUE(close_rel_l2(to_float(d_out.download<uint16_t>()), ref, 5e-3));
}

}  // namespace
}  // namespace moebatch::test
