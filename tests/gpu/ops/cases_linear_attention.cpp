// Cases of the Gated DeltaNet kernels (kernels/linear_attention.cuh): causal conv + SiLU and the
// gated delta rule, each on a step of sequences that start at position 0 (their slots hold random
// values that must be ignored) or continue a random state, and the gated RMSNorm. The fp64
// references mirror engine/cpu/gated_delta_net.cpp: its regrouping of the in_proj row, its conv
// window, its delta rule token by token.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "common/random.h"
#include "kernels/linear_attention.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {
namespace {

using kernels::GdnDims;
using std::to_string;

// The state written back is fp32 (no output rounding): only fp32 arithmetic separates it from
// the fp64 reference.
constexpr double kStateTol = 1e-4;
constexpr double kL2NormEps = 1e-6;  // transformers' l2norm epsilon, as the CPU reference

int conv_dim(const GdnDims& d) { return 2 * d.nk * d.dk + d.nv * d.dv; }
int64_t proj_width(const GdnDims& d) {
  const int64_t r = d.nv / d.nk;
  return d.nk * (2 * d.dk + 2 * r * d.dv) + 2 * d.nv;
}
GdnDims dims_of(const GdnStepShape& s) { return {s.nk, s.nv, s.dk, s.dv, s.conv_kernel}; }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// n floats uniform in [-scale, scale] from (seed, i), filled in parallel (a slot of the 80B
// shape's delta-rule state is 2 MB).
std::vector<float> random_floats(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  constexpr size_t kPiece = size_t{1} << 16;
  parallel_for(CEIL_DIV(n, kPiece), [&](size_t piece) {
    for (size_t i = piece * kPiece; i < std::min(n, (piece + 1) * kPiece); ++i)
      v[i] = (2.f * uniform01(seed, i) - 1.f) * scale;
  });
  return v;
}

// One in_proj row split as the CPU does: q | k | v in conv channel order, z [nv, dv], b and a
// [nv] (per key head g: q dk, k dk, v r·dv, z r·dv; then per key head: b r, a r).
struct ProjRow {
  std::vector<double> qkv, z, b, a;
};
ProjRow split_proj(const GdnDims& d, const uint16_t* row) {
  const int r = d.nv / d.nk, grp = 2 * d.dk + 2 * r * d.dv, key = d.nk * d.dk;
  ProjRow p{std::vector<double>(conv_dim(d)), std::vector<double>(static_cast<size_t>(d.nv) * d.dv),
            std::vector<double>(d.nv), std::vector<double>(d.nv)};
  for (int g = 0; g < d.nk; ++g) {
    const uint16_t* src = row + g * grp;
    for (int i = 0; i < d.dk; ++i) {
      p.qkv[g * d.dk + i] = bf2f(src[i]);
      p.qkv[key + g * d.dk + i] = bf2f(src[d.dk + i]);
    }
    for (int i = 0; i < r * d.dv; ++i) {
      p.qkv[2 * key + g * r * d.dv + i] = bf2f(src[2 * d.dk + i]);
      p.z[g * r * d.dv + i] = bf2f(src[2 * d.dk + r * d.dv + i]);
    }
    for (int j = 0; j < r; ++j) {
      p.b[g * r + j] = bf2f(row[d.nk * grp + g * 2 * r + j]);
      p.a[g * r + j] = bf2f(row[d.nk * grp + g * 2 * r + r + j]);
    }
  }
  return p;
}

std::string lens_text(const std::vector<int>& v) {
  if (v.size() > 1 && std::all_of(v.begin(), v.end(), [&](int x) { return x == v[0]; }))
    return to_string(v.size()) + "x" + to_string(v[0]);
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + to_string(x);
  return s;
}

// The step both stateful cases run: sequences, positions, slots (a random permutation of
// num_seqs + 3, so spare slots exist and must stay untouched; pad_seq gets -1) and the proj
// buffer with a padded row stride.
class GdnStep {
 public:
  void setup(const GdnStepShape& s, std::mt19937& rng, cudaStream_t stream) {
    dims = dims_of(s);
    num_seqs = static_cast<int>(s.q_lens.size());
    num_slots = num_seqs + 3;
    q_start.assign(num_seqs + 1, 0);
    for (int i = 0; i < num_seqs; ++i) q_start[i + 1] = q_start[i] + s.q_lens[i];
    tokens = q_start[num_seqs];
    positions.clear();
    for (int i = 0; i < num_seqs; ++i)
      for (int t = 0; t < s.q_lens[i]; ++t) positions.push_back(first_pos(s, i) + t);
    std::vector<int32_t> perm(num_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    slots.assign(perm.begin(), perm.begin() + num_seqs);
    if (s.pad_seq >= 0) slots[s.pad_seq] = -1;
    proj_stride = proj_width(dims) + 8;
    proj = RandomBf16(static_cast<size_t>(std::max(tokens, 1)) * proj_stride, 2.f, rng, stream);
    d_q_start = DevBuf<int32_t>(q_start);
    d_positions = DevBuf<int32_t>(positions.empty() ? std::vector<int32_t>{0} : positions);
    d_slots = DevBuf<int32_t>(slots);
  }
  static int first_pos(const GdnStepShape& s, int seq) {
    return s.first_pos[seq % s.first_pos.size()];
  }
  kernels::GdnSeqs seqs() const {
    return {d_q_start.get(), d_positions.get(), d_slots.get(), num_seqs};
  }
  int len(int s) const { return q_start[s + 1] - q_start[s]; }
  /// The sequence starts from a zero state (the kernels' reset rule).
  bool fresh(int s) const { return slots[s] < 0 || positions[q_start[s]] == 0; }
  /// The kernel advances this sequence's slot.
  bool writes(int s) const { return slots[s] >= 0 && len(s) > 0; }
  /// Per slot: true when some sequence's state is written there.
  std::vector<bool> written_slots() const {
    std::vector<bool> w(num_slots, false);
    for (int s = 0; s < num_seqs; ++s)
      if (writes(s)) w[slots[s]] = true;
    return w;
  }
  /// Sequences that read their slot's state (continuing, non-empty).
  int reading_seqs() const {
    int n = 0;
    for (int s = 0; s < num_seqs; ++s) n += writes(s) && !fresh(s);
    return n;
  }

  GdnDims dims;
  int num_seqs = 0, num_slots = 0, tokens = 0;
  int64_t proj_stride = 0;
  std::vector<int32_t> q_start, positions, slots;
  RandomBf16 proj;
  DevBuf<int32_t> d_q_start, d_positions, d_slots;
};

// Compares a state buffer [slots, per_slot]: slots the kernel wrote within tol (exact when tol
// is 0), every other slot bit-exact.
void check_state(OpCheck& c, const char* what, const GdnStep& st, size_t per_slot,
                 const std::vector<float>& got, const std::vector<double>& ref, double tol) {
  const auto written = st.written_slots();
  std::vector<float> got_w, got_u, want_u;
  std::vector<double> ref_w;
  for (int slot = 0; slot < st.num_slots; ++slot)
    for (size_t i = slot * per_slot; i < (slot + 1) * per_slot; ++i) {
      if (written[slot]) {
        got_w.push_back(got[i]);
        ref_w.push_back(ref[i]);
      } else {
        got_u.push_back(got[i]);
        want_u.push_back(static_cast<float>(ref[i]));
      }
    }
  const std::string name(what);
  if (tol > 0) {
    c.rel_l2(name + " (written slots)", got_w, ref_w, tol);
  } else {
    c.equal(name + " (written slots)", got_w, std::vector<float>(ref_w.begin(), ref_w.end()));
  }
  c.equal(name + " (other slots)", got_u, want_u);
}

// --- causal conv + SiLU -----------------------------------------------------------------------

class CausalConvCase final : public OpCase {
 public:
  explicit CausalConvCase(const GdnStepShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    st_.setup(s_, rng, env.stream);
    const int C = conv_dim(st_.dims), K = s_.conv_kernel;
    weight_ = RandomBf16(static_cast<size_t>(C) * K, 0.5f, rng, env.stream);
    state0_ = random_floats(static_cast<size_t>(st_.num_slots) * C * (K - 1), rng(), 2.f);
    state_ = DevBuf<float>(state0_);
    out_ = DevBuf<bf16>(static_cast<size_t>(std::max(st_.tokens, 1)) * C);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::CausalConvParams p;
    p.out = out_.get();
    p.proj = st_.proj.get();
    p.proj_stride = st_.proj_stride;
    p.weight = weight_.get();
    p.conv_state = state_.get();
    p.seqs = st_.seqs();
    p.dims = st_.dims;
    if (s_.decode)
      kernels::causal_conv_decode(p, env.stream);
    else
      kernels::causal_conv_prefill(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const int C = conv_dim(st_.dims), K = s_.conv_kernel;
    const auto proj = st_.proj.original(env.stream);
    const auto w = to_float(weight_.original(env.stream));
    std::vector<double> ref(static_cast<size_t>(st_.tokens) * C),
        state(state0_.begin(), state0_.end());
    for (int s = 0; s < st_.num_seqs; ++s) {
      if (st_.len(s) == 0) continue;
      // window: the slot's last K-1 inputs (oldest first), or zeros for a fresh sequence
      std::vector<std::vector<double>> win(C, std::vector<double>(K - 1, 0.0));
      if (!st_.fresh(s))
        for (int c = 0; c < C; ++c)
          for (int j = 0; j < K - 1; ++j)
            win[c][j] = state0_[(static_cast<size_t>(st_.slots[s]) * C + c) * (K - 1) + j];
      for (int t = st_.q_start[s]; t < st_.q_start[s + 1]; ++t) {
        const ProjRow row = split_proj(st_.dims, proj.data() + t * st_.proj_stride);
        for (int c = 0; c < C; ++c) {
          const double in = row.qkv[c];
          double acc = w[static_cast<size_t>(c) * K + K - 1] * in;
          for (int j = 0; j < K - 1; ++j) acc += w[static_cast<size_t>(c) * K + j] * win[c][j];
          win[c].erase(win[c].begin());
          win[c].push_back(in);
          ref[static_cast<size_t>(t) * C + c] = silu(acc);
        }
      }
      if (st_.writes(s))
        for (int c = 0; c < C; ++c)
          for (int j = 0; j < K - 1; ++j)
            state[(static_cast<size_t>(st_.slots[s]) * C + c) * (K - 1) + j] = win[c][j];
    }
    OpCheck c;
    auto out = to_float(out_.download<uint16_t>());
    out.resize(ref.size());
    // bf16 output: one rounding (~2^-9 per element)
    c.rel_l2("out", out, ref, tol);
    // the new state is the last K-1 inputs themselves: exact
    check_state(c, "conv state", st_, static_cast<size_t>(C) * (K - 1), state_.download<float>(),
                state, 0);
    return c;
  }
  // proj channels read, out written, the slots' windows read (continuing) and written, weights
  double bytes() const override {
    const double C = conv_dim(dims_of(s_)), K = s_.conv_kernel;
    int written = 0;
    for (int s = 0; s < st_.num_seqs; ++s) written += st_.writes(s);
    return 4.0 * st_.tokens * C + 4.0 * C * (K - 1) * (written + st_.reading_seqs()) + 2.0 * C * K;
  }
  double flops() const override {
    return 2.0 * st_.tokens * conv_dim(dims_of(s_)) * s_.conv_kernel;
  }

 private:
  GdnStepShape s_;
  GdnStep st_;
  RandomBf16 weight_;
  std::vector<float> state0_;
  DevBuf<float> state_;
  DevBuf<bf16> out_;
};

// --- gated delta rule -------------------------------------------------------------------------

class GatedDeltaRuleCase final : public OpCase {
 public:
  explicit GatedDeltaRuleCase(const GdnStepShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    st_.setup(s_, rng, env.stream);
    const GdnDims& d = st_.dims;
    mixed_ = RandomBf16(static_cast<size_t>(std::max(st_.tokens, 1)) * conv_dim(d), 1.f, rng,
                        env.stream);
    // A_log and dt_bias in [-1, 1]: decays exp(-e^A_log · softplus(a + dt_bias)) from ~0 to ~0.95
    a_log_.resize(d.nv);
    dt_bias_.resize(d.nv);
    for (auto* v : {&a_log_, &dt_bias_})
      for (auto& x : *v) x = f2bf(std::uniform_real_distribution<float>(-1.f, 1.f)(rng));
    d_a_log_ = DevBuf<bf16>(a_log_);
    d_dt_bias_ = DevBuf<bf16>(dt_bias_);
    state0_ = random_floats(static_cast<size_t>(st_.num_slots) * slot_floats(), rng(), 0.5f);
    state_ = DevBuf<float>(state0_);
    out_ = DevBuf<bf16>(static_cast<size_t>(std::max(st_.tokens, 1)) * d.nv * d.dv);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::GatedDeltaRuleParams p;
    p.out = out_.get();
    p.mixed = mixed_.get();
    p.proj = st_.proj.get();
    p.proj_stride = st_.proj_stride;
    p.a_log = d_a_log_.get();
    p.dt_bias = d_dt_bias_.get();
    p.ssm_state = state_.get();
    p.seqs = st_.seqs();
    p.dims = st_.dims;
    if (s_.decode)
      kernels::gated_delta_rule_decode(p, env.stream);
    else
      kernels::gated_delta_rule_prefill(p, env.stream, s_.form);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const GdnDims& d = st_.dims;
    const int C = conv_dim(d), r = d.nv / d.nk, dk = d.dk, dv = d.dv;
    const auto proj = st_.proj.original(env.stream);
    const auto mixed = to_float(mixed_.original(env.stream));
    std::vector<double> ref(static_cast<size_t>(st_.tokens) * d.nv * dv),
        state(state0_.begin(), state0_.end());
    // q, k L2-normalised per head, q scaled by 1/sqrt(dk): per token, all heads
    std::vector<double> qk(static_cast<size_t>(st_.tokens) * 2 * d.nk * dk);
    for (int t = 0; t < st_.tokens; ++t)
      for (int hh = 0; hh < 2 * d.nk; ++hh) {
        const float* x = mixed.data() + static_cast<size_t>(t) * C + hh * dk;
        double ss = 0;
        for (int i = 0; i < dk; ++i) ss += static_cast<double>(x[i]) * x[i];
        const double scale =
            1.0 / std::sqrt(ss + kL2NormEps) * (hh < d.nk ? 1.0 / std::sqrt(dk) : 1.0);
        for (int i = 0; i < dk; ++i)
          qk[(static_cast<size_t>(t) * 2 * d.nk + hh) * dk + i] = x[i] * scale;
      }
    parallel_for(static_cast<size_t>(st_.num_seqs) * d.nv, [&](size_t w) {
      const int s = static_cast<int>(w / d.nv), h = static_cast<int>(w % d.nv), kh = h / r;
      if (st_.len(s) == 0) return;
      std::vector<double> S(static_cast<size_t>(dk) * dv, 0.0), delta(dv);
      const size_t slot_off = (static_cast<size_t>(std::max(st_.slots[s], 0)) * d.nv + h) * dk * dv;
      if (!st_.fresh(s)) std::copy_n(state0_.begin() + slot_off, S.size(), S.begin());
      const double neg_a = -std::exp(static_cast<double>(bf2f(a_log_[h]))),
                   dt_bias = bf2f(dt_bias_[h]);
      for (int t = st_.q_start[s]; t < st_.q_start[s + 1]; ++t) {
        const ProjRow row = split_proj(d, proj.data() + t * st_.proj_stride);
        const double* q = qk.data() + (static_cast<size_t>(t) * 2 * d.nk + kh) * dk;
        const double* k = qk.data() + (static_cast<size_t>(t) * 2 * d.nk + d.nk + kh) * dk;
        const float* v = mixed.data() + static_cast<size_t>(t) * C + 2 * d.nk * dk + h * dv;
        const double beta = sigmoid(row.b[h]),
                     decay = std::exp(neg_a * softplus(row.a[h] + dt_bias));
        // S ← decay·S; delta = beta·(v − Sᵀk); S ← S + k ⊗ delta; o = Sᵀq
        std::fill(delta.begin(), delta.end(), 0.0);
        for (int i = 0; i < dk; ++i)
          for (int j = 0; j < dv; ++j) {
            S[i * dv + j] *= decay;
            delta[j] += S[i * dv + j] * k[i];
          }
        for (int j = 0; j < dv; ++j) delta[j] = (v[j] - delta[j]) * beta;
        double* o = ref.data() + (static_cast<size_t>(t) * d.nv + h) * dv;
        for (int i = 0; i < dk; ++i)
          for (int j = 0; j < dv; ++j) {
            S[i * dv + j] += k[i] * delta[j];
            o[j] += S[i * dv + j] * q[i];
          }
      }
      if (st_.writes(s)) std::copy(S.begin(), S.end(), state.begin() + slot_off);
    });
    OpCheck c;
    auto out = to_float(out_.download<uint16_t>());
    out.resize(ref.size());
    // bf16 output: one rounding (~2^-9 per element) on fp32 sums of dk terms
    c.rel_l2("out", out, ref, tol);
    check_state(c, "delta-rule state", st_, slot_floats(), state_.download<float>(), state,
                kStateTol);
    return c;
  }
  // the state read (continuing sequences) and written, q/k/v and b/a read, o written
  double bytes() const override {
    const GdnDims d = dims_of(s_);
    int written = 0;
    for (int s = 0; s < st_.num_seqs; ++s) written += st_.writes(s);
    return 4.0 * slot_floats() * (written + st_.reading_seqs()) +
           2.0 * st_.tokens * (conv_dim(d) + 2.0 * d.nv + static_cast<double>(d.nv) * d.dv);
  }
  // per token and value head: decay, Sᵀk, the rank-1 update, Sᵀq over dk·dv
  double flops() const override { return 7.0 * st_.tokens * s_.nv * s_.dk * s_.dv; }

 private:
  size_t slot_floats() const { return static_cast<size_t>(s_.nv) * s_.dk * s_.dv; }
  GdnStepShape s_;
  GdnStep st_;
  RandomBf16 mixed_;
  std::vector<uint16_t> a_log_, dt_bias_;
  DevBuf<bf16> d_a_log_, d_dt_bias_;
  std::vector<float> state0_;
  DevBuf<float> state_;
  DevBuf<bf16> out_;
};

// --- gated RMSNorm ----------------------------------------------------------------------------

class GatedRmsNormCase final : public OpCase {
 public:
  explicit GatedRmsNormCase(const GatedRmsNormShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const GdnDims d = dims();
    proj_stride_ = proj_width(d) + 8;
    proj_ = RandomBf16(static_cast<size_t>(s_.tokens) * proj_stride_, 3.f, rng, env.stream);
    o_ = RandomBf16(static_cast<size_t>(s_.tokens) * d.nv * d.dv, 2.f, rng, env.stream);
    w_ = RandomBf16(d.dv, 1.5f, rng, env.stream);
    if (!s_.in_place) {
      out_ = DevBuf<bf16>(o_.size());
      out_.poison();
    }
  }
  void run(const OpEnv& env, int) override {
    kernels::GatedRmsNormParams p;
    p.out = s_.in_place ? o_.get() : out_.get();
    p.o = o_.get();
    p.proj = proj_.get();
    p.proj_stride = proj_stride_;
    p.weight = w_.get();
    p.num_tokens = s_.tokens;
    p.dims = dims();
    p.eps = kEps;
    kernels::gated_rmsnorm(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const GdnDims d = dims();
    const auto proj = proj_.original(env.stream);
    const auto o = to_float(o_.original(env.stream)), w = to_float(w_.original(env.stream));
    std::vector<double> ref(o.size());
    for (int t = 0; t < s_.tokens; ++t) {
      const ProjRow row = split_proj(d, proj.data() + t * proj_stride_);
      for (int h = 0; h < d.nv; ++h) {
        const size_t base = (static_cast<size_t>(t) * d.nv + h) * d.dv;
        double ss = 0;
        for (int j = 0; j < d.dv; ++j) ss += static_cast<double>(o[base + j]) * o[base + j];
        const double inv = 1.0 / std::sqrt(ss / d.dv + kEps);
        for (int j = 0; j < d.dv; ++j)
          ref[base + j] = o[base + j] * inv * w[j] * silu(row.z[h * d.dv + j]);
      }
    }
    OpCheck c;
    const auto out = s_.in_place ? o_.current() : out_.download<uint16_t>();
    c.rel_l2("out", to_float(out), ref, tol);
    return c;
  }
  double bytes() const override {
    return 6.0 * s_.tokens * s_.nv * s_.dv;
  }  // o, z read; out written

 private:
  static constexpr float kEps = 1e-6f;
  GdnDims dims() const { return {s_.nk, s_.nv, s_.dk, s_.dv, 4}; }
  GatedRmsNormShape s_;
  int64_t proj_stride_ = 0;
  RandomBf16 proj_, o_, w_;
  DevBuf<bf16> out_;
};

std::string step_text(const GdnStepShape& s) {
  std::string t = "k" + to_string(s.nk) + "/v" + to_string(s.nv) + " d" + to_string(s.dk) + "/" +
                  to_string(s.dv) + " K" + to_string(s.conv_kernel) + " q" + lens_text(s.q_lens) +
                  " pos" + lens_text(s.first_pos);
  if (s.pad_seq >= 0) t += " pad" + to_string(s.pad_seq);
  if (!s.decode && s.form == kernels::DeltaRuleForm::recurrent) t += " recurrent";
  if (!s.decode && s.form == kernels::DeltaRuleForm::chunked) t += " chunked";
  return t;
}

void check_step_shape(const GdnStepShape& s, const char* op) {
  MB_CHECK(!s.q_lens.empty() && !s.first_pos.empty(),
           std::string(op) + " case: needs q_lens and first_pos");
  MB_CHECK(s.pad_seq < static_cast<int>(s.q_lens.size()),
           std::string(op) + " case: pad_seq out of range");
}

}  // namespace

OpCaseDef causal_conv_case(const GdnStepShape& s) {
  check_step_shape(s, "causal_conv");
  return op_case_def<CausalConvCase>(s.decode ? "causal_conv decode" : "causal_conv prefill",
                                     step_text(s), OpFamily::linear_attention, 5e-3, s);
}

OpCaseDef gated_delta_rule_case(const GdnStepShape& s) {
  check_step_shape(s, "gated_delta_rule");
  return op_case_def<GatedDeltaRuleCase>(
      s.decode ? "gated_delta_rule decode" : "gated_delta_rule prefill", step_text(s),
      OpFamily::linear_attention, 5e-3, s);
}

OpCaseDef gated_rmsnorm_case(const GatedRmsNormShape& s) {
  return op_case_def<GatedRmsNormCase>("gated_rmsnorm",
                                       "t" + to_string(s.tokens) + " k" + to_string(s.nk) + "/v" +
                                           to_string(s.nv) + " d" + to_string(s.dk) + "/" +
                                           to_string(s.dv) + (s.in_place ? " in-place" : ""),
                                       OpFamily::linear_attention, 5e-3, s);
}

}  // namespace moebatch::ops
