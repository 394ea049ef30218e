// Cases of the element-wise and copy ops: embedding gather, RMSNorm (+ residual), q/k norm +
// RoPE (+ fused cache write), KV cache write, SiLU·mul, MoE combine, shared-expert gate.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>

#include "kernels/embedding.cuh"
#include "kernels/kv_cache.cuh"
#include "kernels/moe_ops.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {
namespace {

using std::to_string;

class EmbeddingCase final : public OpCase {
 public:
  explicit EmbeddingCase(const EmbeddingShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    table_ = RandomBf16(static_cast<size_t>(s_.vocab) * s_.hidden, 1.f, rng, env.stream);
    ids_.resize(s_.tokens);
    for (auto& id : ids_) id = std::uniform_int_distribution<int>(0, s_.vocab - 1)(rng);
    if (s_.bad_ids) {
      ids_[5] = -1;
      ids_[9] = s_.vocab;
    }
    d_ids_ = DevBuf<int32_t>(ids_);
    out_ = DevBuf<bf16>(static_cast<size_t>(s_.tokens) * s_.hidden);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::embedding_gather(out_.get(), table_.get(), d_ids_.get(), s_.tokens, s_.hidden, s_.vocab, env.stream);
  }
  OpCheck check(const OpEnv& env, double) override {
    const auto table = table_.original(env.stream);
    std::vector<uint16_t> want(out_.size());
    for (int t = 0; t < s_.tokens; ++t) {
      const bool bad = ids_[t] < 0 || ids_[t] >= s_.vocab;
      for (int h = 0; h < s_.hidden; ++h)
        want[static_cast<size_t>(t) * s_.hidden + h] = bad ? 0 : table[static_cast<size_t>(ids_[t]) * s_.hidden + h];
    }
    OpCheck c;
    c.equal("out", out_.download<uint16_t>(), want);
    return c;
  }
  double bytes() const override { return 4.0 * s_.tokens * s_.hidden; }

 private:
  EmbeddingShape s_;
  RandomBf16 table_;
  std::vector<int32_t> ids_;
  DevBuf<int32_t> d_ids_;
  DevBuf<bf16> out_;
};

class RmsNormCase final : public OpCase {
 public:
  explicit RmsNormCase(const RmsNormShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const size_t n = static_cast<size_t>(s_.rows) * s_.cols;
    x_ = RandomBf16(n, 2.f, rng, env.stream);
    if (s_.add) res_ = RandomBf16(n, 2.f, rng, env.stream);
    w_ = RandomBf16(s_.cols, 1.5f, rng, env.stream);
    out_ = DevBuf<bf16>(n);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::RmsNormParams p;
    p.out = out_.get();
    p.in = x_.get();
    p.residual = s_.add ? res_.get() : nullptr;
    p.weight = w_.get();
    p.rows = s_.rows;
    p.cols = s_.cols;
    p.eps = kEps;
    p.weight_offset = s_.weight_offset;
    if (s_.add) kernels::add_rmsnorm(p, env.stream); else kernels::rmsnorm(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const auto x = x_.original_f(env.stream), w = w_.original_f(env.stream);
    const auto res = s_.add ? res_.original_f(env.stream) : std::vector<float>{};
    std::vector<double> ref;
    std::vector<float> new_res;
    add_rmsnorm_ref(x, s_.add ? &res : nullptr, w, s_.rows, s_.cols, kEps, s_.weight_offset, new_res, ref);
    OpCheck c;
    // bf16 output: one rounding, ~2^-9 relative per element.
    c.rel_l2("out", to_float(out_.download<uint16_t>()), ref, tol);
    if (s_.add) c.equal("residual", to_float(res_.current()), new_res);
    return c;
  }
  // in, out (+ residual read and written)
  double bytes() const override { return (s_.add ? 8.0 : 4.0) * s_.rows * s_.cols; }

 private:
  static constexpr float kEps = 1e-6f;
  RmsNormShape s_;
  RandomBf16 x_, res_, w_;
  DevBuf<bf16> out_;
};

// q, k and v heads of a token in one fused row, as the engine's qkv projection leaves them.
class QkNormRopeCase final : public OpCase {
 public:
  explicit QkNormRopeCase(const QkNormRopeShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads, width = row_width();
    qkv_ = RandomBf16(static_cast<size_t>(s_.tokens) * width, 3.f, rng, env.stream);
    if (s_.norm) {
      qn_ = RandomBf16(hd, 1.5f, rng, env.stream);
      kn_ = RandomBf16(hd, 1.5f, rng, env.stream);
    }
    pos_.assign(s_.tokens, s_.position);
    if (s_.position < 0) {
      for (auto& v : pos_) v = std::uniform_int_distribution<int>(0, 40000)(rng);
      pos_[0] = 0;
    }
    d_pos_ = DevBuf<int32_t>(pos_);
    p_ = {};
    p_.q = qkv_.get();
    p_.k = qkv_.get() + nq * hd;
    p_.q_stride = p_.k_stride = width;
    p_.q_norm = s_.norm ? qn_.get() : nullptr;
    p_.k_norm = s_.norm ? kn_.get() : nullptr;
    p_.positions = d_pos_.get();
    p_.tokens = s_.tokens;
    p_.n_q_heads = nq;
    p_.n_kv_heads = nkv;
    p_.head_dim = hd;
    p_.theta = kTheta;
    p_.eps = kEps;
    p_.rotary_dim = s_.rotary_dim;
    p_.norm_offset = s_.norm_offset;
    if (s_.table) {  // as a forward does: once for all its layers
      table_ = DevBuf<float2>(static_cast<size_t>(s_.tokens) * (rotated_dims() / 2));
      kernels::rope_rotation_table(d_pos_.get(), s_.tokens, rotated_dims(), kTheta, table_.get(), env.stream);
      p_.rotation = table_.get();
    }
    if (s_.cache) {
      const int num_slots = 3 * s_.tokens;
      kc_ = RandomBf16(static_cast<size_t>(num_slots) * nkv * hd, 1.f, rng, env.stream);
      vc_ = RandomBf16(kc_.size(), 1.f, rng, env.stream);
      slots_.resize(num_slots);
      std::iota(slots_.begin(), slots_.end(), 0);
      std::shuffle(slots_.begin(), slots_.end(), rng);
      slots_.resize(s_.tokens);
      slots_[2] = -1;  // padding token
      d_slots_ = DevBuf<int32_t>(slots_);
      p_.k_cache = kc_.get();
      p_.v_cache = vc_.get();
      p_.v = qkv_.get() + (nq + nkv) * hd;
      p_.v_stride = width;
      p_.slot_mapping = d_slots_.get();
    }
  }
  void run(const OpEnv& env, int) override { kernels::qk_norm_rope(p_, env.stream); }
  OpCheck check(const OpEnv& env, double tol) override {
    const int hd = s_.head_dim, nq = s_.n_q_heads, nkv = s_.n_kv_heads, width = row_width();
    const auto qkv = qkv_.original(env.stream);
    const auto got_bits = qkv_.current();
    const auto got = to_float(got_bits);
    const auto qn = s_.norm ? qn_.original(env.stream) : std::vector<uint16_t>{};
    const auto kn = s_.norm ? kn_.original(env.stream) : std::vector<uint16_t>{};
    OpCheck c;
    if (s_.cache) {  // rotated k and v land bit-exactly in their slots; padding and other slots untouched
      const int kv_width = nkv * hd;
      auto want_k = kc_.original(env.stream), want_v = vc_.original(env.stream);
      for (int t = 0; t < s_.tokens; ++t) {
        if (slots_[t] < 0) continue;
        const size_t row = static_cast<size_t>(t) * width, slot = static_cast<size_t>(slots_[t]) * kv_width;
        for (int i = 0; i < kv_width; ++i) {
          want_k[slot + i] = got_bits[row + nq * hd + i];
          want_v[slot + i] = qkv[row + (nq + nkv) * hd + i];
        }
      }
      c.equal("k cache", kc_.current(), want_k);
      c.equal("v cache", vc_.current(), want_v);
    }
    std::vector<uint16_t> v_got, v_want;
    std::vector<float> rot_got;
    std::vector<double> rot_ref;
    for (int t = 0; t < s_.tokens; ++t) {
      for (int h = 0; h < nq + 2 * nkv; ++h) {
        const size_t base = static_cast<size_t>(t) * width + static_cast<size_t>(h) * hd;
        if (h >= nq + nkv) {  // v heads: untouched
          v_got.insert(v_got.end(), got_bits.begin() + base, got_bits.begin() + base + hd);
          v_want.insert(v_want.end(), qkv.begin() + base, qkv.begin() + base + hd);
          continue;
        }
        const auto& w = h < nq ? qn : kn;
        const int rd = s_.rotary_dim > 0 ? s_.rotary_dim : hd, rh = rd / 2;
        double ss = 0;
        for (int d = 0; d < hd; ++d) ss += std::pow(static_cast<double>(bf2f(qkv[base + d])), 2);
        const double rstd = s_.norm ? 1.0 / std::sqrt(ss / hd + kEps) : 1.0;
        auto normed = [&](int d) {
          return bf2f(qkv[base + d]) * rstd * (s_.norm ? s_.norm_offset + bf2f(w[d]) : 1.0);
        };
        for (int i = 0; i < rh; ++i) {
          const double a = normed(i), b = normed(i + rh);
          const double ang = static_cast<double>(pos_[t]) * std::pow(static_cast<double>(kTheta), -2.0 * i / rd);
          rot_ref.push_back(a * std::cos(ang) - b * std::sin(ang));
          rot_ref.push_back(b * std::cos(ang) + a * std::sin(ang));
          rot_got.push_back(got[base + i]);
          rot_got.push_back(got[base + i + rh]);
        }
        for (int d = rd; d < hd; ++d) {  // partial rotary: the tail is only normalised
          rot_ref.push_back(normed(d));
          rot_got.push_back(got[base + d]);
        }
      }
    }
    c.equal("v heads", v_got, v_want);
    // bf16 rounding of the output plus fp32 angle error at positions up to 4e4 (~4e-3 rad).
    c.rel_l2("q/k", rot_got, rot_ref, tol);
    if (s_.table) c.equal("q/k as without the table", got_bits, without_table(env));
    return c;
  }
  // q and k read and written; with the cache, k and v rows also read/written to their slots
  double bytes() const override {
    const double kv = static_cast<double>(s_.tokens) * s_.n_kv_heads * s_.head_dim;
    return 4.0 * s_.tokens * (s_.n_q_heads + s_.n_kv_heads) * s_.head_dim + (s_.cache ? 6.0 * kv : 0.0);
  }

 private:
  static constexpr float kTheta = 1e6f, kEps = 1e-6f;
  int row_width() const { return (s_.n_q_heads + 2 * s_.n_kv_heads) * s_.head_dim; }
  int rotated_dims() const { return kernels::rope_rotated_dims(s_.rotary_dim, s_.head_dim); }
  // The original rows rotated by the kernel computing its own (cos, sin): the table must give
  // the same bits.
  std::vector<uint16_t> without_table(const OpEnv& env) {
    DevBuf<bf16> rows(qkv_.original(env.stream));
    kernels::QkNormRopeParams p = p_;
    p.q = rows.get();
    p.k = rows.get() + s_.n_q_heads * s_.head_dim;
    p.rotation = nullptr;
    p.k_cache = p.v_cache = nullptr;
    p.v = nullptr;
    p.slot_mapping = nullptr;
    kernels::qk_norm_rope(p, env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    return rows.download<uint16_t>();
  }
  QkNormRopeShape s_;
  RandomBf16 qkv_, qn_, kn_, kc_, vc_;
  std::vector<int32_t> pos_, slots_;
  DevBuf<int32_t> d_pos_, d_slots_;
  DevBuf<float2> table_;
  kernels::QkNormRopeParams p_;
};

class KvCacheWriteCase final : public OpCase {
 public:
  explicit KvCacheWriteCase(const KvCacheWriteShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int width = s_.n_kv_heads * s_.head_dim;
    kv_ = RandomBf16(static_cast<size_t>(s_.tokens) * s_.stride, 1.f, rng, env.stream);
    kc_ = RandomBf16(static_cast<size_t>(s_.num_slots) * width, 1.f, rng, env.stream);
    vc_ = RandomBf16(kc_.size(), 1.f, rng, env.stream);
    slots_.resize(s_.num_slots);
    std::iota(slots_.begin(), slots_.end(), 0);
    std::shuffle(slots_.begin(), slots_.end(), rng);
    slots_.resize(s_.tokens);
    if (s_.padding) slots_[3] = -1;
    d_slots_ = DevBuf<int32_t>(slots_);
  }
  void run(const OpEnv& env, int) override {
    kernels::KvCacheWriteParams p;
    p.k_cache = kc_.get();
    p.v_cache = vc_.get();
    p.k = kv_.get() + s_.k_offset;
    p.v = kv_.get() + s_.k_offset + s_.n_kv_heads * s_.head_dim;
    p.k_stride = p.v_stride = s_.stride;
    p.slot_mapping = d_slots_.get();
    p.tokens = s_.tokens;
    p.n_kv_heads = s_.n_kv_heads;
    p.head_dim = s_.head_dim;
    kernels::kv_cache_write(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double) override {
    const int width = s_.n_kv_heads * s_.head_dim;
    const auto kv = kv_.original(env.stream);
    auto want_k = kc_.original(env.stream), want_v = vc_.original(env.stream);
    for (int t = 0; t < s_.tokens; ++t) {
      if (slots_[t] < 0) continue;
      const size_t row = static_cast<size_t>(t) * s_.stride + s_.k_offset;
      for (int i = 0; i < width; ++i) {
        want_k[static_cast<size_t>(slots_[t]) * width + i] = kv[row + i];
        want_v[static_cast<size_t>(slots_[t]) * width + i] = kv[row + width + i];
      }
    }
    OpCheck c;
    c.equal("k cache", kc_.current(), want_k);
    c.equal("v cache", vc_.current(), want_v);
    return c;
  }
  double bytes() const override { return 4.0 * s_.tokens * 2 * s_.n_kv_heads * s_.head_dim; }

 private:
  KvCacheWriteShape s_;
  RandomBf16 kv_, kc_, vc_;
  std::vector<int32_t> slots_;
  DevBuf<int32_t> d_slots_;
};

class SiluMulCase final : public OpCase {
 public:
  explicit SiluMulCase(const SiluMulShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    in_ = RandomBf16(static_cast<size_t>(s_.rows) * 2 * s_.inter, 4.f, rng, env.stream);
    out_ = DevBuf<bf16>(static_cast<size_t>(s_.rows) * s_.inter);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::silu_mul(out_.get(), in_.get(), s_.rows, s_.inter, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const auto in = in_.original(env.stream);
    std::vector<double> ref(out_.size());
    for (int r = 0; r < s_.rows; ++r)
      for (int i = 0; i < s_.inter; ++i) {
        const double g = bf2f(in[static_cast<size_t>(r) * 2 * s_.inter + i]);
        const double u = bf2f(in[static_cast<size_t>(r) * 2 * s_.inter + s_.inter + i]);
        ref[static_cast<size_t>(r) * s_.inter + i] = g / (1 + std::exp(-g)) * u;
      }
    OpCheck c;
    c.rel_l2("out", to_float(out_.download<uint16_t>()), ref, tol);
    return c;
  }
  double bytes() const override { return 2.0 * s_.rows * 3 * s_.inter; }

 private:
  SiluMulShape s_;
  RandomBf16 in_;
  DevBuf<bf16> out_;
};

// x *= sigmoid(gate), the gate read from a wider row (the engine reads it out of the qkv rows).
class SigmoidGateCase final : public OpCase {
 public:
  explicit SigmoidGateCase(const SigmoidGateShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    x_ = RandomBf16(static_cast<size_t>(s_.rows) * s_.cols, 3.f, rng, env.stream);
    gate_ = RandomBf16(static_cast<size_t>(s_.rows) * stride(), 4.f, rng, env.stream);
  }
  void run(const OpEnv& env, int) override {
    kernels::sigmoid_gate_mul(x_.get(), gate_.get() + s_.gate_offset, stride(), s_.rows, s_.cols,
                              env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const auto x = x_.original(env.stream), g = gate_.original(env.stream);
    std::vector<double> ref(x.size());
    for (int r = 0; r < s_.rows; ++r)
      for (int i = 0; i < s_.cols; ++i) {
        const double gv = bf2f(g[static_cast<size_t>(r) * stride() + s_.gate_offset + i]);
        ref[static_cast<size_t>(r) * s_.cols + i] =
            bf2f(x[static_cast<size_t>(r) * s_.cols + i]) / (1 + std::exp(-gv));
      }
    OpCheck c;
    c.rel_l2("x", to_float(x_.current()), ref, tol);
    return c;
  }
  double bytes() const override { return 6.0 * s_.rows * s_.cols; }

 private:
  int64_t stride() const { return s_.gate_offset + s_.cols; }
  SigmoidGateShape s_;
  RandomBf16 x_, gate_;
};

class MoeCombineCase final : public OpCase {
 public:
  explicit MoeCombineCase(const MoeCombineShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    y_ = RandomBf16(static_cast<size_t>(s_.tokens) * s_.top_k * s_.hidden, 2.f, rng, env.stream);
    w_.resize(static_cast<size_t>(s_.tokens) * s_.top_k);
    for (auto& v : w_) v = std::uniform_real_distribution<float>(0.f, 1.f)(rng);
    d_w_ = DevBuf<float>(w_);
    if (s_.experts > 0) {
      // Distinct experts per token; token 0 only gets other ranks' experts (a zero row). Rows of
      // pairs that are not local are NaN, as unwritten expert outputs may be: never read.
      std::vector<int32_t> all(s_.experts), others;
      std::iota(all.begin(), all.end(), 0);
      std::copy_if(all.begin(), all.end(), std::back_inserter(others), [&](int e) { return !local_expert(e); });
      ids_.resize(w_.size());
      for (int t = 0; t < s_.tokens; ++t) {
        std::vector<int32_t>& pool = t == 0 && static_cast<int>(others.size()) >= s_.top_k ? others : all;
        std::shuffle(pool.begin(), pool.end(), rng);
        std::copy(pool.begin(), pool.begin() + s_.top_k, ids_.begin() + static_cast<size_t>(t) * s_.top_k);
      }
      d_ids_ = DevBuf<int32_t>(ids_);
      for (size_t pair = 0; pair < ids_.size(); ++pair) {
        if (local_expert(ids_[pair])) continue;
        CUDA_CHECK(cudaMemsetAsync(y_.get() + pair * s_.hidden, 0xff, s_.hidden * sizeof(bf16), env.stream));
      }
    }
    out_ = DevBuf<bf16>(static_cast<size_t>(s_.tokens) * s_.hidden);
    out_.poison();
    if (s_.add_rmsnorm) {
      res_ = RandomBf16(static_cast<size_t>(s_.tokens) * s_.hidden, 2.f, rng, env.stream);
      nw_ = RandomBf16(s_.hidden, 1.5f, rng, env.stream);
    }
  }
  void run(const OpEnv& env, int) override {
    if (s_.add_rmsnorm) {
      kernels::moe_combine_add_rmsnorm(params(out_.get()), norm(res_.get(), nullptr), env.stream);
      return;
    }
    if (s_.experts == 0) {
      kernels::moe_combine(out_.get(), y_.get(), s_.weighted ? d_w_.get() : nullptr, s_.tokens, s_.top_k,
                           s_.hidden, env.stream);
      return;
    }
    kernels::MoeCombineParams p;
    p.out = out_.get();
    p.expert_out = y_.get();
    p.weights = s_.weighted ? d_w_.get() : nullptr;
    p.tokens = s_.tokens;
    p.top_k = s_.top_k;
    p.hidden = s_.hidden;
    p.topk_ids = d_ids_.get();
    p.expert0 = s_.expert0;
    p.num_local = s_.local_experts;
    kernels::moe_combine(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    if (s_.add_rmsnorm) return check_fused(env, tol);
    const auto y = y_.original(env.stream);
    const int H = s_.hidden, K = s_.top_k;
    std::vector<double> ref(out_.size(), 0.0);
    for (int t = 0; t < s_.tokens; ++t)
      for (int j = 0; j < K; ++j) {
        if (s_.experts > 0 && !local_expert(ids_[t * K + j])) continue;
        for (int h = 0; h < H; ++h)
          ref[static_cast<size_t>(t) * H + h] +=
              (s_.weighted ? w_[t * K + j] : 1.0) * bf2f(y[(static_cast<size_t>(t) * K + j) * H + h]);
      }
    OpCheck c;
    const auto out = to_float(out_.download<uint16_t>());
    c.rel_l2("out", out, ref, tol);
    if (s_.experts > 0) {
      bool zero_row = true;  // token 0 has no local pair
      for (int h = 0; h < H; ++h) zero_row = zero_row && out[h] == 0.f;
      c.expect(zero_row || static_cast<int>(s_.experts - s_.local_experts) < K, "a token without local pairs has a zero row");
    }
    return c;
  }
  double bytes() const override {
    return 2.0 * s_.tokens * s_.top_k * s_.hidden + (s_.add_rmsnorm ? 6.0 : 2.0) * s_.tokens * s_.hidden;
  }

 private:
  bool local_expert(int e) const { return e >= s_.expert0 && e < s_.expert0 + s_.local_experts; }
  kernels::MoeCombineParams params(bf16* out) const {
    kernels::MoeCombineParams p;
    p.out = out;
    p.expert_out = y_.get();
    p.weights = s_.weighted ? d_w_.get() : nullptr;
    p.tokens = s_.tokens;
    p.top_k = s_.top_k;
    p.hidden = s_.hidden;
    if (s_.experts > 0) {
      p.topk_ids = d_ids_.get();
      p.expert0 = s_.expert0;
      p.num_local = s_.local_experts;
    }
    return p;
  }
  kernels::RmsNormParams norm(bf16* residual, const bf16* in) const {
    kernels::RmsNormParams n;
    n.out = out_.get();
    n.in = in;
    n.residual = residual;
    n.weight = nw_.get();
    n.rows = s_.tokens;
    n.cols = s_.hidden;
    n.eps = 1e-6f;
    n.weight_offset = s_.weight_offset;
    return n;
  }
  // The fused kernel against its contract, bit for bit: moe_combine into a buffer, then
  // add_rmsnorm of it on a copy of the original residual; and the output within tol of the fp64
  // chain (sum, bf16 rounding of sum and residual as the kernels do, norm).
  OpCheck check_fused(const OpEnv& env, double tol) {
    const std::vector<uint16_t> got_out = out_.download<uint16_t>(), got_res = res_.current();
    const std::vector<uint16_t> res0 = res_.original(env.stream);
    DevBuf<bf16> combined(static_cast<size_t>(s_.tokens) * s_.hidden), res(res0.size());
    CUDA_CHECK(cudaMemcpy(res.get(), res0.data(), res0.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    kernels::moe_combine(params(combined.get()), env.stream);
    kernels::add_rmsnorm(norm(res.get(), combined.get()), env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    OpCheck c;
    c.equal("residual vs moe_combine + add_rmsnorm", got_res, res.download<uint16_t>());
    c.equal("out vs moe_combine + add_rmsnorm", got_out, out_.download<uint16_t>());
    const auto y = y_.original(env.stream), w = nw_.original(env.stream);
    const int H = s_.hidden, K = s_.top_k;
    std::vector<double> ref(got_out.size());
    for (int t = 0; t < s_.tokens; ++t) {
      std::vector<double> r(H);
      double ss = 0;
      for (int h = 0; h < H; ++h) {
        double o = 0;
        for (int j = 0; j < K; ++j) {
          if (s_.experts > 0 && !local_expert(ids_[t * K + j])) continue;
          o += (s_.weighted ? w_[t * K + j] : 1.0) * bf2f(y[(static_cast<size_t>(t) * K + j) * H + h]);
        }
        r[h] = round_bf(bf2f(res0[static_cast<size_t>(t) * H + h]) + round_bf(static_cast<float>(o)));
        ss += r[h] * r[h];
      }
      const double rstd = 1.0 / std::sqrt(ss / H + 1e-6);
      for (int h = 0; h < H; ++h) ref[static_cast<size_t>(t) * H + h] = r[h] * rstd * (s_.weight_offset + bf2f(w[h]));
    }
    c.rel_l2("out vs fp64", to_float(got_out), ref, tol);
    return c;
  }
  MoeCombineShape s_;
  RandomBf16 y_, res_, nw_;
  std::vector<float> w_;
  std::vector<int32_t> ids_;
  DevBuf<float> d_w_;
  DevBuf<int32_t> d_ids_;
  DevBuf<bf16> out_;
};

class SharedExpertGateCase final : public OpCase {
 public:
  explicit SharedExpertGateCase(const SharedExpertGateShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const size_t n = static_cast<size_t>(s_.tokens) * s_.hidden;
    moe_ = RandomBf16(n, 1.f, rng, env.stream);
    shared_ = RandomBf16(n, 1.f, rng, env.stream);
    x_ = RandomBf16(n, 1.f, rng, env.stream);
    gw_ = RandomBf16(s_.hidden, 0.05f, rng, env.stream);
    out_ = DevBuf<bf16>(n);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::SharedExpertGateParams p;
    p.out = out_.get();
    p.moe_out = moe_.get();
    p.shared_out = shared_.get();
    p.x = x_.get();
    p.gate_weight = gw_.get();
    p.tokens = s_.tokens;
    p.hidden = s_.hidden;
    kernels::shared_expert_gate(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const auto moe = moe_.original(env.stream), shared = shared_.original(env.stream);
    const auto x = x_.original(env.stream), gw = gw_.original(env.stream);
    const int H = s_.hidden;
    std::vector<double> ref(moe.size());
    for (int t = 0; t < s_.tokens; ++t) {
      double dot = 0;
      for (int h = 0; h < H; ++h) dot += static_cast<double>(bf2f(x[static_cast<size_t>(t) * H + h])) * bf2f(gw[h]);
      const double g = 1.0 / (1.0 + std::exp(-dot));
      for (int h = 0; h < H; ++h) {
        const size_t i = static_cast<size_t>(t) * H + h;
        ref[i] = bf2f(moe[i]) + g * bf2f(shared[i]);
      }
    }
    OpCheck c;
    c.rel_l2("out", to_float(out_.download<uint16_t>()), ref, tol);
    return c;
  }
  double bytes() const override { return 8.0 * s_.tokens * s_.hidden; }

 private:
  SharedExpertGateShape s_;
  RandomBf16 moe_, shared_, x_, gw_;
  DevBuf<bf16> out_;
};

}  // namespace

OpCaseDef embedding_case(const EmbeddingShape& s) {
  MB_CHECK(!s.bad_ids || s.tokens > 9, "embedding case: bad_ids needs more than 9 tokens");
  return op_case_def<EmbeddingCase>("embedding",
                                 "t" + to_string(s.tokens) + " H" + to_string(s.hidden) + " V" +
                                     to_string(s.vocab) + (s.bad_ids ? " bad-ids" : ""),
                                 OpFamily::embedding, 0, s);
}

OpCaseDef rmsnorm_case(const RmsNormShape& s) {
  return op_case_def<RmsNormCase>(s.add ? "add_rmsnorm" : "rmsnorm",
                               to_string(s.rows) + "x" + to_string(s.cols) + (s.weight_offset != 0.f ? " 1+w" : ""),
                               OpFamily::rmsnorm, 5e-3, s);
}

OpCaseDef qk_norm_rope_case(const QkNormRopeShape& s) {
  MB_CHECK(!s.cache || s.tokens > 2, "qk_norm_rope case: the cache write needs more than 2 tokens");
  return op_case_def<QkNormRopeCase>(
      "qk_norm_rope",
      "t" + to_string(s.tokens) + " q" + to_string(s.n_q_heads) + "/kv" + to_string(s.n_kv_heads) + " d" +
          to_string(s.head_dim) + (s.norm ? " norm" : " no-norm") + (s.cache ? " cache" : "") +
          (s.position >= 0 ? " pos" + to_string(s.position) : "") +
          (s.rotary_dim > 0 ? " rot" + to_string(s.rotary_dim) : "") + (s.norm_offset != 0.f ? " 1+w" : "") +
          (s.table ? " table" : ""),
      OpFamily::rope, 8e-3, s);
}

OpCaseDef kv_cache_write_case(const KvCacheWriteShape& s) {
  MB_CHECK(!s.padding || s.tokens > 3, "kv_cache_write case: padding needs more than 3 tokens");
  MB_CHECK(s.tokens <= s.num_slots, "kv_cache_write case: more tokens than slots");
  return op_case_def<KvCacheWriteCase>("kv_cache_write",
                                    "t" + to_string(s.tokens) + " kv" + to_string(s.n_kv_heads) + " d" +
                                        to_string(s.head_dim) + " slots" + to_string(s.num_slots) + " stride" +
                                        to_string(s.stride) + (s.padding ? " padding" : ""),
                                    OpFamily::kv_cache, 0, s);
}

OpCaseDef silu_mul_case(const SiluMulShape& s) {
  return op_case_def<SiluMulCase>("silu_mul", to_string(s.rows) + "x" + to_string(s.inter), OpFamily::moe_ops, 5e-3, s);
}

OpCaseDef sigmoid_gate_case(const SigmoidGateShape& s) {
  return op_case_def<SigmoidGateCase>("sigmoid_gate_mul",
                                      to_string(s.rows) + "x" + to_string(s.cols) + " @" + to_string(s.gate_offset),
                                      OpFamily::moe_ops, 5e-3, s);
}

OpCaseDef moe_combine_case(const MoeCombineShape& s) {
  MB_CHECK(s.experts == 0 || (s.local_experts > 0 && s.expert0 >= 0 && s.expert0 + s.local_experts <= s.experts &&
                              s.top_k <= s.experts),
           "moe_combine case: bad expert range");
  return op_case_def<MoeCombineCase>(
      s.add_rmsnorm ? (s.weight_offset != 0.f ? "moe_combine_add_rmsnorm 1+w" : "moe_combine_add_rmsnorm")
                    : "moe_combine",
      "t" + to_string(s.tokens) + " k" + to_string(s.top_k) + " H" + to_string(s.hidden) +
          (s.weighted ? " weighted" : " unweighted") +
          (s.experts > 0 ? " E" + to_string(s.experts) + " local" + to_string(s.local_experts) + "@" + to_string(s.expert0)
                         : ""),
      OpFamily::moe_ops, 5e-3, s);
}

OpCaseDef shared_expert_gate_case(const SharedExpertGateShape& s) {
  return op_case_def<SharedExpertGateCase>("shared_expert_gate", "t" + to_string(s.tokens) + " H" + to_string(s.hidden),
                                        OpFamily::moe_ops, 5e-3, s);
}

}  // namespace moebatch::ops
