// Cases of the cuBLAS linear wrapper and the GPU samplers against CPU references on fresh random
// inputs; top-k/top-p is also checked for batch invariance (a row's token ignores its neighbours).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "kernels/gemm.cuh"
#include "kernels/random.cuh"
#include "kernels/sampling.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {
namespace {

using std::to_string;

class LinearCase final : public OpCase {
 public:
  explicit LinearCase(const LinearShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    x_ = RandomBf16(static_cast<size_t>(s_.m) * s_.k, 1.f, rng, env.stream);
    switch (s_.format) {  // one place per weight format: its fill here, its dequantization in check()
      case WeightFormat::bf16: w_ = RandomBf16(static_cast<size_t>(s_.n) * s_.k, s_.w_scale, rng, env.stream); break;
      case WeightFormat::fp8_block:
      case WeightFormat::nvfp4:
      case WeightFormat::int8:
      case WeightFormat::int4:
        MB_CHECK(false, "linear case: compressed weights are quant_linear_case's (cases_quant.cpp)");
    }
    const size_t n_out = static_cast<size_t>(s_.m) * s_.n;
    if (s_.fp32_out) {
      out_f_ = DevBuf<float>(n_out);
      out_f_.poison();
    } else {
      out_b_ = DevBuf<bf16>(n_out);
      out_b_.poison();
    }
  }
  void run(const OpEnv& env, int) override {
    MB_CHECK(env.cublas != nullptr, "linear case: needs a cuBLAS handle in OpEnv");
    if (s_.fp32_out) kernels::linear(env.cublas, env.stream, out_f_.get(), x_.get(), w_.get(), s_.m, s_.n, s_.k);
    else kernels::linear(env.cublas, env.stream, out_b_.get(), x_.get(), w_.get(), s_.m, s_.n, s_.k);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const int m = s_.m, n = s_.n, k = s_.k;
    const auto x = x_.original_f(env.stream);
    const auto w = w_.original(env.stream);
    std::vector<double> ref(static_cast<size_t>(m) * n);
    parallel_for(n, [&](size_t j) {
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int c = 0; c < k; ++c) s += static_cast<double>(x[static_cast<size_t>(i) * k + c]) * bf2f(w[j * k + c]);
        ref[static_cast<size_t>(i) * n + j] = s;
      }
    });
    OpCheck c;
    c.rel_l2("out", s_.fp32_out ? out_f_.download<float>() : to_float(out_b_.download<uint16_t>()), ref, tol);
    return c;
  }
  double bytes() const override {
    return 2.0 * s_.n * s_.k + 2.0 * s_.m * s_.k + (s_.fp32_out ? 4.0 : 2.0) * s_.m * s_.n;
  }
  double flops() const override { return 2.0 * s_.m * s_.n * s_.k; }

 private:
  LinearShape s_;
  RandomBf16 x_, w_;
  DevBuf<float> out_f_;
  DevBuf<bf16> out_b_;
};

std::vector<float> random_logits(std::mt19937& rng, int batch, int vocab, float sd) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> l(static_cast<size_t>(batch) * vocab);
  for (auto& v : l) v = nd(rng);
  return l;
}

class GreedyCase final : public OpCase {
 public:
  explicit GreedyCase(const GreedyShape& s) : s_(s) {}
  void setup(const OpEnv&, uint32_t seed) override {
    std::mt19937 rng(seed);
    logits_ = random_logits(rng, s_.batch, s_.vocab, 3.f);
    if (s_.plant_tie) {  // planted tie: the lowest id must win
      logits_[2 * static_cast<size_t>(s_.vocab) + 777] = 100.f;
      logits_[2 * static_cast<size_t>(s_.vocab) + 90000] = 100.f;
    }
    d_logits_ = DevBuf<float>(logits_);
    out_ = DevBuf<int32_t>(s_.batch);
    out_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::sample_greedy(out_.get(), d_logits_.get(), s_.batch, s_.vocab, env.stream);
  }
  OpCheck check(const OpEnv&, double) override {
    std::vector<int32_t> want(s_.batch);
    for (int b = 0; b < s_.batch; ++b) {
      const float* row = &logits_[static_cast<size_t>(b) * s_.vocab];
      want[b] = static_cast<int32_t>(std::max_element(row, row + s_.vocab) - row);
    }
    const auto got = out_.download<int32_t>();
    OpCheck c;
    c.equal("tokens", got, want);
    if (s_.plant_tie) c.expect(got[2] == 777, "planted tie: row 2 got " + to_string(got[2]) + " want 777");
    return c;
  }
  double bytes() const override { return 4.0 * s_.batch * s_.vocab; }

 private:
  GreedyShape s_;
  std::vector<float> logits_;
  DevBuf<float> d_logits_;
  DevBuf<int32_t> out_;
};

struct RowControls {
  SamplingControls c;
  uint64_t seed, step;
};

// Checks a sampled token against the documented algorithm in fp64. Draws that land within
// slack · total mass of a boundary (cumulative-mass or top-p cut) may go either way in fp32.
// Returns the mismatch, empty when the token is right.
std::string sample_error(const float* row, int vocab, const RowControls& r, int got, double slack_rel) {
  const SamplingControls& c = r.c;
  if (!(c.temperature > 0.f)) {
    const int want = static_cast<int>(std::max_element(row, row + vocab) - row);
    return got == want ? "" : "greedy row: got " + to_string(got) + " want " + to_string(want);
  }
  int k = c.top_k <= 0 || c.top_k > kernels::kSamplingMaxK ? kernels::kSamplingMaxK : c.top_k;
  k = std::min(k, vocab);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  std::vector<double> cum(k);
  double total = 0;
  for (int i = 0; i < k; ++i) cum[i] = (total += std::exp((row[order[i]] - row[order[0]]) / static_cast<double>(c.temperature)));
  int keep = 0;
  while (keep < k && (keep == 0 || cum[keep - 1] < c.top_p * total)) ++keep;
  const double u = kernels::uniform01(r.seed, r.step) * cum[keep - 1];
  int want = 0;
  while (want < keep - 1 && cum[want] <= u) ++want;
  if (order[want] == got) return {};
  const int pos = static_cast<int>(std::find(order.begin(), order.begin() + k, got) - order.begin());
  const double slack = slack_rel * total;
  if (pos < k) {
    const int lo = std::min(pos, want);
    if (std::abs(cum[lo] - u) < slack) return {};  // draw at a boundary
    if (pos == keep && std::abs(cum[keep - 1] - c.top_p * total) < slack) return {};  // top-p cut
  }
  return "got " + to_string(got) + " (rank " + to_string(pos) + ") want " + to_string(order[want]) + " (rank " +
         to_string(want) + "), kept " + to_string(keep) + " of " + to_string(k);
}

class TopKTopPCase final : public OpCase {
 public:
  explicit TopKTopPCase(const TopKTopPShape& s) : s_(s) {}
  void setup(const OpEnv&, uint32_t seed) override {
    std::mt19937 rng(seed);
    rows_.clear();
    for (int b = 0; b < s_.batch; ++b) {
      const uint64_t hi = rng();
      rows_.push_back({s_.controls[b % s_.controls.size()], (hi << 32) | rng(), rng() % 1000});
    }
    logits_ = random_logits(rng, s_.batch, s_.vocab, 2.f);
    if (s_.quantize_rows) {  // quantized logits create ties at the top-k boundary
      for (int i = 0; i < s_.vocab; ++i) {
        float& a = logits_[static_cast<size_t>(3) * s_.vocab + i];
        float& b = logits_[static_cast<size_t>(7) * s_.vocab + i];
        a = std::round(a * 4) / 4;
        b = std::round(b * 2) / 2;
      }
    }
    perm_seed_ = rng();
    std::vector<int> ident(s_.batch);
    std::iota(ident.begin(), ident.end(), 0);
    inputs_.emplace(inputs(ident));
    out_ = DevBuf<int32_t>(s_.batch);
    out_.poison();
  }
  void run(const OpEnv& env, int) override { kernels::sample_top_k_top_p(inputs_->params(out_.get()), env.stream); }
  OpCheck check(const OpEnv& env, double tol) override {
    const auto got = out_.download<int32_t>();
    OpCheck c;
    for (int b = 0; b < s_.batch; ++b) {
      const std::string err = sample_error(&logits_[static_cast<size_t>(b) * s_.vocab], s_.vocab, rows_[b], got[b], tol);
      c.expect(err.empty(), "row " + to_string(b) + ": " + err);
    }
    // The same rows in another order: every row's token must not move with its position.
    std::vector<int> perm(s_.batch);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(perm_seed_);
    std::shuffle(perm.begin(), perm.end(), rng);
    const SamplingInputs permuted = inputs(perm);
    DevBuf<int32_t> out(s_.batch);
    out.poison();
    kernels::sample_top_k_top_p(permuted.params(out.get()), env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    const auto pout = out.download<int32_t>();
    std::vector<int32_t> by_row(s_.batch);
    for (int b = 0; b < s_.batch; ++b) by_row[perm[b]] = pout[b];
    c.equal("tokens with the batch permuted", by_row, got);
    return c;
  }
  double bytes() const override { return 4.0 * s_.batch * s_.vocab; }

 private:
  // Row b of the launch is row perm[b] of the case.
  SamplingInputs inputs(const std::vector<int>& perm) const {
    const int B = s_.batch, V = s_.vocab;
    std::vector<float> lp(logits_.size()), temp(B), top_p(B);
    std::vector<int32_t> top_k(B);
    std::vector<uint64_t> seeds(B), steps(B);
    for (int b = 0; b < B; ++b) {
      const RowControls& r = rows_[perm[b]];
      std::copy_n(&logits_[static_cast<size_t>(perm[b]) * V], V, &lp[static_cast<size_t>(b) * V]);
      temp[b] = r.c.temperature;
      top_p[b] = r.c.top_p;
      top_k[b] = r.c.top_k;
      seeds[b] = r.seed;
      steps[b] = r.step;
    }
    return SamplingInputs(lp, temp, top_k, top_p, seeds, steps);
  }
  TopKTopPShape s_;
  std::vector<RowControls> rows_;
  std::vector<float> logits_;
  uint32_t perm_seed_ = 0;
  std::optional<SamplingInputs> inputs_;
  DevBuf<int32_t> out_;
};

}  // namespace

SamplingInputs::SamplingInputs(const std::vector<float>& logits, const std::vector<float>& temperature,
                               const std::vector<int32_t>& top_k, const std::vector<float>& top_p,
                               const std::vector<uint64_t>& seeds, const std::vector<uint64_t>& steps)
    : batch_(static_cast<int>(temperature.size())),
      vocab_(batch_ > 0 ? static_cast<int>(logits.size() / batch_) : 0),
      logits_(logits), temperature_(temperature), top_p_(top_p), top_k_(top_k), seeds_(seeds), steps_(steps) {
  MB_CHECK(top_k.size() == temperature.size() && top_p.size() == temperature.size() &&
               seeds.size() == temperature.size() && steps.size() == temperature.size() &&
               logits.size() == static_cast<size_t>(batch_) * vocab_,
           "SamplingInputs: one control per row and batch * vocab logits");
}

kernels::SamplingParams SamplingInputs::params(int32_t* out_tokens) const {
  kernels::SamplingParams p;
  p.out_tokens = out_tokens;
  p.logits = logits_.get();
  p.temperature = temperature_.get();
  p.top_k = top_k_.get();
  p.top_p = top_p_.get();
  p.seeds = seeds_.get();
  p.steps = steps_.get();
  p.batch = batch_;
  p.vocab = vocab_;
  return p;
}

OpCaseDef linear_case(const LinearShape& s) {
  OpCaseDef d = op_case_def<LinearCase>(
      s.fp32_out ? "linear fp32-out" : "linear bf16-out",
      "m" + to_string(s.m) + " n" + to_string(s.n) + " k" + to_string(s.k), OpFamily::gemm, s.fp32_out ? 1e-5 : 5e-3, s);
  d.format = s.format;
  return d;
}

OpCaseDef sample_greedy_case(const GreedyShape& s) {
  MB_CHECK(!s.plant_tie || (s.batch > 2 && s.vocab > 90000), "sample_greedy case: the planted tie needs row 2 and id 90000");
  return op_case_def<GreedyCase>("sample_greedy",
                                 "b" + to_string(s.batch) + " V" + to_string(s.vocab) + (s.plant_tie ? " tie" : ""),
                                 OpFamily::sampling, 0, s);
}

OpCaseDef top_k_top_p_case(const TopKTopPShape& s) {
  MB_CHECK(!s.controls.empty(), "sample_top_k_top_p case: needs row controls");
  MB_CHECK(!s.quantize_rows || s.batch > 7, "sample_top_k_top_p case: quantized rows 3 and 7 need 8 rows");
  std::string ctl = s.controls.size() > 1 ? "mixed" : "";
  if (s.controls.size() == 1) {
    char b[64];
    std::snprintf(b, sizeof b, "T%.2g k%d p%.2g", s.controls[0].temperature, s.controls[0].top_k, s.controls[0].top_p);
    ctl = b;
  }
  // tol: a draw this close (relative to the candidates' mass) to a boundary may fall either way
  return op_case_def<TopKTopPCase>("sample_top_k_top_p", "b" + to_string(s.batch) + " V" + to_string(s.vocab) + " " + ctl,
                                   OpFamily::sampling, 1e-4, s);
}

}  // namespace moebatch::ops
