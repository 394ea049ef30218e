// Cases of the MoE router, the alignment, the fused small-batch route and the grouped expert
// GEMM against CPU references, including an expert that receives more rows than one GEMM pass
// holds, skewed (hot-expert) routings, the expert-parallel alignment of one rank's experts, and
// expert weights in every weight format (decoded for the reference by tests/gpu/ops/quant_util.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "kernels/gemm.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_ops.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/moe_sorted.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/quant.cuh"
#include "engine/safetensors.h"
#include "tests/gpu/ops/op_shapes.h"
#include "tests/gpu/ops/quant_util.h"

namespace moebatch::ops {
namespace {

using kernels::kMoeGemmTileM;
using std::to_string;

// Reference router on the same (already rounded) logits: softmax in fp64, ties -> lower id.
void router_ref(const std::vector<float>& logits, int tokens, int E, int K, bool renorm,
                std::vector<int32_t>& ids, std::vector<double>& w) {
  ids.assign(static_cast<size_t>(tokens) * K, 0);
  w.assign(ids.size(), 0);
  for (int t = 0; t < tokens; ++t) {
    const float* row = &logits[static_cast<size_t>(t) * E];
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    const double mx = row[order[0]];
    double sum = 0, picked = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(row[e] - mx);
    for (int j = 0; j < K; ++j) picked += std::exp(row[order[j]] - mx) / sum;
    for (int j = 0; j < K; ++j) {
      ids[t * K + j] = order[j];
      w[t * K + j] = std::exp(row[order[j]] - mx) / sum / (renorm ? picked : 1.0);
    }
  }
}

// Random distinct experts per token; with hot >= 0 every token also picks `hot` (skewed load).
std::vector<int32_t> random_routing(std::mt19937& rng, int tokens, int E, int K, int hot) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens) * K);
  std::vector<int> all(E);
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    if (hot >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), hot));
    for (int j = 0; j < K; ++j) ids[t * K + j] = all[j];
  }
  return ids;
}

// Expert parallel: a rank holding experts [expert0, expert0 + local) sees pair i under local id
// ids[i] - expert0, or -1 (dropped) when another rank holds its expert. local 0: all local.
std::vector<int32_t> local_ids(const std::vector<int32_t>& ids, int expert0, int local) {
  if (local == 0) return ids;
  std::vector<int32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    out[i] = ids[i] >= expert0 && ids[i] < expert0 + local ? ids[i] - expert0 : -1;
  return out;
}

// " local16@48": the expert range of an expert-parallel case (empty when every expert is local).
std::string local_range(int expert0, int local) {
  return local > 0 ? " local" + to_string(local) + "@" + to_string(expert0) : "";
}

// moe_align's contract for the expert ids `ids`: per expert, exactly its pairs (any order), the
// segment padded to kMoeGemmTileM with the sentinel `pairs`; the active list ascending.
// Returns the first violation, empty when none.
std::string align_error(const std::vector<int32_t>& ids, const std::vector<int32_t>& sorted,
                        const std::vector<int32_t>& off, const std::vector<int32_t>& active, int E) {
  const int pairs = static_cast<int>(ids.size());
  if (off[0] != 0) return "expert_offsets[0] = " + to_string(off[0]);
  std::vector<int32_t> want_active;
  for (int e = 0; e < E; ++e) {
    std::vector<int32_t> want;
    for (int i = 0; i < pairs; ++i)
      if (ids[i] == e) want.push_back(i);
    if (!want.empty()) want_active.push_back(e);
    const int padded = (static_cast<int>(want.size()) + kMoeGemmTileM - 1) / kMoeGemmTileM * kMoeGemmTileM;
    if (off[e + 1] - off[e] != padded || off[e + 1] > static_cast<int>(sorted.size()))
      return "expert " + to_string(e) + ": segment [" + to_string(off[e]) + ", " + to_string(off[e + 1]) +
             ") for " + to_string(want.size()) + " pairs";
    std::vector<int32_t> got(sorted.begin() + off[e], sorted.begin() + off[e] + want.size());
    std::sort(got.begin(), got.end());
    if (got != want) return "expert " + to_string(e) + ": wrong pairs";
    for (int i = off[e] + static_cast<int>(want.size()); i < off[e + 1]; ++i)
      if (sorted[i] != pairs) return "expert " + to_string(e) + ": padding " + to_string(sorted[i]);
  }
  if (active.empty()) return {};
  if (active[0] != static_cast<int32_t>(want_active.size()))
    return "active count " + to_string(active[0]) + " want " + to_string(want_active.size());
  if (!std::equal(want_active.begin(), want_active.end(), active.begin() + 1)) return "active experts differ";
  return {};
}

class RouterCase final : public OpCase {
 public:
  explicit RouterCase(const RouterShape& s) : s_(s) {}
  void setup(const OpEnv&, uint32_t seed) override {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 2.f);
    logits_.resize(static_cast<size_t>(s_.tokens) * s_.experts);
    for (auto& v : logits_) v = s_.bf16_logits ? round_bf(nd(rng)) : nd(rng);
    if (s_.bf16_logits) {
      std::vector<uint16_t> lb(logits_.size());
      for (size_t i = 0; i < lb.size(); ++i) lb[i] = f2bf(logits_[i]);
      d_lb_ = DevBuf<bf16>(lb);
    } else {
      d_lf_ = DevBuf<float>(logits_);
    }
    ids_ = DevBuf<int32_t>(static_cast<size_t>(s_.tokens) * s_.top_k);
    w_ = DevBuf<float>(ids_.size());
    ids_.poison();
    w_.poison();
  }
  void run(const OpEnv& env, int) override {
    kernels::RouterParams p;
    p.topk_ids = ids_.get();
    p.topk_weights = w_.get();
    p.tokens = s_.tokens;
    p.num_experts = s_.experts;
    p.top_k = s_.top_k;
    p.renormalize = s_.renormalize;
    if (s_.bf16_logits) kernels::moe_router_topk(p, d_lb_.get(), env.stream);
    else kernels::moe_router_topk(p, d_lf_.get(), env.stream);
  }
  OpCheck check(const OpEnv&, double tol) override {
    std::vector<int32_t> ids;
    std::vector<double> w;
    router_ref(logits_, s_.tokens, s_.experts, s_.top_k, s_.renormalize, ids, w);
    OpCheck c;
    c.equal("ids", ids_.download<int32_t>(), ids);
    c.rel_l2("weights", w_.download<float>(), w, tol);
    return c;
  }
  double bytes() const override {
    return (s_.bf16_logits ? 2.0 : 4.0) * s_.tokens * s_.experts + 8.0 * s_.tokens * s_.top_k;
  }

 private:
  RouterShape s_;
  std::vector<float> logits_;
  DevBuf<float> d_lf_, w_;
  DevBuf<bf16> d_lb_;
  DevBuf<int32_t> ids_;
};

// One routing's device side: expert ids and moe_align's outputs for them.
struct Routing {
  DevBuf<int32_t> ids, sorted, offsets, active, workspace;
  kernels::AlignParams align(int pairs, int E, int expert0 = 0) const {
    kernels::AlignParams a;
    a.sorted_ids = sorted.get();
    a.expert_offsets = offsets.get();
    a.active_experts = active.get();
    a.topk_ids = ids.get();
    a.num_pairs = pairs;
    a.num_experts = E;
    a.block_m = kMoeGemmTileM;
    a.expert0 = expert0;
    a.workspace = workspace.get();
    return a;
  }
};

// `count` random routings, outputs poisoned; ids0 keeps the first on the host. Returns the mean
// number of experts hit.
double make_routings(std::mt19937& rng, int tokens, int E, int K, int hot, int count,
                     std::vector<Routing>& out, std::vector<int32_t>& ids0) {
  const int pairs = tokens * K, cap = kernels::moe_align_capacity(pairs, E, kMoeGemmTileM);
  double hit = 0;
  out.clear();
  for (int r = 0; r < count; ++r) {
    const auto ids = random_routing(rng, tokens, E, K, hot);
    hit += static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size()) / count;
    if (r == 0) ids0 = ids;
    Routing& R = out.emplace_back(Routing{DevBuf<int32_t>(ids), DevBuf<int32_t>(cap), DevBuf<int32_t>(E + 1),
                                          DevBuf<int32_t>(E + 1),
                                          DevBuf<int32_t>(kernels::moe_align_workspace_ints(E))});
    R.workspace.poison();
    R.sorted.poison();
    R.offsets.poison();
    R.active.poison();
  }
  return hit;
}

class AlignCase final : public OpCase {
 public:
  explicit AlignCase(const AlignShape& s) : s_(s) {}
  void setup(const OpEnv&, uint32_t seed) override {
    std::mt19937 rng(seed);
    make_routings(rng, s_.tokens, s_.experts, s_.top_k, s_.hot, s_.routings, routings_, ids0_);
  }
  void run(const OpEnv& env, int iter) override {
    kernels::AlignParams a = routings_[iter % s_.routings].align(s_.tokens * s_.top_k, aligned(), s_.expert0);
    if (s_.one_block) a.workspace = nullptr;
    kernels::moe_align(a, env.stream);
  }
  OpCheck check(const OpEnv&, double) override {
    const Routing& r = routings_[0];
    const std::string err =
        align_error(local_ids(ids0_, s_.expert0, s_.local_experts), r.sorted.download<int32_t>(),
                    r.offsets.download<int32_t>(), r.active.download<int32_t>(), aligned());
    OpCheck c;
    c.expect(err.empty(), "align: " + err);
    return c;
  }
  double bytes() const override { return 8.0 * s_.tokens * s_.top_k; }

 private:
  int aligned() const { return s_.local_experts > 0 ? s_.local_experts : s_.experts; }
  AlignShape s_;
  std::vector<Routing> routings_;
  std::vector<int32_t> ids0_;
};

// The many-token path's gather (kernels/moe_sorted.cuh) after a real moe_align: every sorted row
// below the device's row count is its pair's input row bit for bit (padding rows zero), and the
// pair → row map inverts the sort; rows past the count stay untouched (poisoned).
class GatherSortedCase final : public OpCase {
 public:
  explicit GatherSortedCase(const GatherSortedShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    make_routings(rng, s_.tokens, s_.experts, s_.top_k, s_.hot, 1, routings_, ids0_);
    kernels::moe_align(routings_[0].align(pairs(), s_.experts), env.stream);
    x_ = RandomBf16(static_cast<size_t>(s_.tokens) * s_.hidden, 1.f, rng, env.stream);
    out_ = DevBuf<bf16>(static_cast<size_t>(cap()) * s_.hidden);
    rows_ = DevBuf<int32_t>(pairs());
    out_.poison();
    rows_.poison();
  }
  void run(const OpEnv& env, int) override {
    const Routing& r = routings_[0];
    kernels::moe_gather_sorted({.out = out_.get(), .row_of_pair = rows_.get(), .in = x_.get(),
                                .sorted_ids = r.sorted.get(), .expert_offsets = r.offsets.get(),
                                .num_experts = s_.experts, .num_pairs = pairs(), .in_row_div = s_.top_k,
                                .hidden = s_.hidden, .rows_cap = cap()},
                               env.stream);
  }
  OpCheck check(const OpEnv& env, double) override {
    const auto sorted = routings_[0].sorted.download<int32_t>();
    const auto offsets = routings_[0].offsets.download<int32_t>();
    const auto out = out_.download<uint16_t>();
    const auto rows = rows_.download<int32_t>();
    const auto x = x_.original(env.stream);
    const int total = offsets[s_.experts], H = s_.hidden;
    std::vector<uint16_t> want(out.size(), 0xffff);
    std::vector<int32_t> want_rows(pairs(), -1);
    for (int i = 0; i < total; ++i) {
      const int id = sorted[i];
      for (int c = 0; c < H; ++c)
        want[static_cast<size_t>(i) * H + c] =
            id >= 0 && id < pairs() ? x[static_cast<size_t>(id / s_.top_k) * H + c] : 0;
      if (id >= 0 && id < pairs()) want_rows[id] = i;
    }
    OpCheck c;
    c.equal("gathered rows", out, want);
    c.equal("row_of_pair", rows, want_rows);
    return c;
  }
  double bytes() const override { return 4.0 * pairs() * s_.hidden; }

 private:
  int pairs() const { return s_.tokens * s_.top_k; }
  int cap() const { return kernels::moe_align_capacity(pairs(), s_.experts, kMoeGemmTileM); }
  GatherSortedShape s_;
  std::vector<Routing> routings_;
  std::vector<int32_t> ids0_;
  RandomBf16 x_;
  DevBuf<bf16> out_;
  DevBuf<int32_t> rows_;
};

// Router rows [period, E) of a [E, H] weight made copies of rows e % period (exact logit ties).
void tie_router_rows(bf16* w, int E, int H, int period, cudaStream_t stream) {
  for (int e0 = period; e0 < E; e0 += period)
    CUDA_CHECK(cudaMemcpyAsync(w + static_cast<size_t>(e0) * H, w,
                               static_cast<size_t>(std::min(period, E - e0)) * H * sizeof(bf16),
                               cudaMemcpyDeviceToDevice, stream));
}
void tie_router_rows(std::vector<float>& w, int E, int H, int period) {
  for (int e = period; e < E; ++e)
    std::copy_n(w.begin() + static_cast<size_t>(e % period) * H, H,
                w.begin() + static_cast<size_t>(e) * H);
}

// Fused small-batch router vs the three-launch contract: logits vs fp64, then top-k exactly as
// router_ref on the kernel's own fp32 logits, and the alignment of those ids; the block counter
// must be back at zero (graph replays reuse it). The top-k must also match moe_router_topk (the
// many-token router) on the same logits bit for bit.
class RouteSmallCase final : public OpCase {
 public:
  explicit RouteSmallCase(const RouteSmallShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int T = s_.tokens, E = s_.experts, pairs = T * s_.top_k;
    x_ = RandomBf16(static_cast<size_t>(T) * s_.hidden, 1.f, rng, env.stream);
    w_ = RandomBf16(static_cast<size_t>(E) * s_.hidden, 0.1f, rng, env.stream);
    if (s_.tie_period > 0) tie_router_rows(w_.get(), E, s_.hidden, s_.tie_period, env.stream);
    logits_ = DevBuf<float>(static_cast<size_t>(T) * E);
    tw_ = DevBuf<float>(pairs);
    ids_ = DevBuf<int32_t>(pairs);
    router_w_ = DevBuf<float>(pairs);
    router_ids_ = DevBuf<int32_t>(pairs);
    router_w_.poison();
    router_ids_.poison();
    sorted_ = DevBuf<int32_t>(kernels::moe_align_capacity(pairs, E, kMoeGemmTileM));
    off_ = DevBuf<int32_t>(E + 1);
    active_ = DevBuf<int32_t>(E + 1);
    counter_ = DevBuf<int32_t>(1);
    for (auto* b : {&ids_, &sorted_, &off_, &active_}) b->poison();
    logits_.poison();
    tw_.poison();
    CUDA_CHECK(cudaMemset(counter_.get(), 0, sizeof(int32_t)));
    if (s_.norm) {
      res_ = RandomBf16(static_cast<size_t>(T) * s_.hidden, 2.f, rng, env.stream);
      norm_w_ = RandomBf16(s_.hidden, 1.5f, rng, env.stream);
      normed_ = DevBuf<bf16>(static_cast<size_t>(T) * s_.hidden);
      normed_.poison();
    }
  }
  void run(const OpEnv& env, int) override {
    kernels::RouteSmallParams p;
    if (s_.norm)
      p.norm = {.branch = x_.get(), .residual = res_.get(), .weight = norm_w_.get(),
                .out = normed_.get(), .eps = kNormEps, .weight_offset = 0.f};
    p.router.topk_ids = ids_.get();
    p.router.topk_weights = tw_.get();
    p.router.tokens = s_.tokens;
    p.router.num_experts = s_.experts;
    p.router.top_k = s_.top_k;
    p.router.renormalize = s_.renormalize;
    p.align.sorted_ids = sorted_.get();
    p.align.expert_offsets = off_.get();
    p.align.topk_ids = ids_.get();
    p.align.num_pairs = s_.tokens * s_.top_k;
    p.align.num_experts = aligned();
    p.align.expert0 = s_.expert0;
    p.align.block_m = kMoeGemmTileM;
    p.align.active_experts = active_.get();
    p.x = x_.get();
    p.weight = w_.get();
    p.logits = logits_.get();
    p.hidden = s_.hidden;
    p.counter = counter_.get();
    p.skip_align = s_.skip_align;
    p.cluster = s_.cluster;  // the case runs only where the cluster launches (its `available`)
    kernels::moe_route_small(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const int T = s_.tokens, E = s_.experts, H = s_.hidden;
    const auto logits = logits_.download<float>();
    auto x = x_.original_f(env.stream);
    auto w = w_.original_f(env.stream);
    if (s_.tie_period > 0) tie_router_rows(w, E, H, s_.tie_period);
    OpCheck c;
    if (s_.norm) {
      // residual + x rounded to bf16 (bit-exact), its RMSNorm (one bf16 rounding); the logits are
      // then checked against the normed rows the kernel produced
      const auto res = res_.original_f(env.stream), nw = norm_w_.original_f(env.stream);
      std::vector<float> new_res;
      std::vector<double> ref;
      add_rmsnorm_ref(x, &res, nw, T, H, kNormEps, 0.f, new_res, ref);
      c.equal("residual", to_float(res_.current()), new_res);
      x = to_float(normed_.download<uint16_t>());
      c.rel_l2("normed", x, ref, 5e-3);
    }
    std::vector<double> ref_logits(logits.size());
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double s = 0;
        for (int k = 0; k < H; ++k) s += static_cast<double>(x[static_cast<size_t>(t) * H + k]) * w[static_cast<size_t>(e) * H + k];
        ref_logits[static_cast<size_t>(t) * E + e] = s;
      }
    c.rel_l2("logits", logits, ref_logits, tol);
    std::vector<int32_t> ids;
    std::vector<double> wref;
    router_ref(logits, T, E, s_.top_k, s_.renormalize, ids, wref);
    const auto got_ids = ids_.download<int32_t>();
    c.equal("ids", got_ids, ids);
    c.rel_l2("weights", tw_.download<float>(), wref, tol);
    if (s_.tie_period > 0) {  // the ties are really there
      bool tied = true;
      for (int t = 0; t < T; ++t) {
        const float* row = &logits[static_cast<size_t>(t) * E];
        for (int e = s_.tie_period; e < E; ++e) tied = tied && row[e] == row[e % s_.tie_period];
      }
      c.expect(tied, "tied router rows gave unequal logits");
    }
    kernels::RouterParams rp;
    rp.topk_ids = router_ids_.get();
    rp.topk_weights = router_w_.get();
    rp.tokens = T;
    rp.num_experts = E;
    rp.top_k = s_.top_k;
    rp.renormalize = s_.renormalize;
    kernels::moe_router_topk(rp, logits_.get(), env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    c.equal("ids vs moe_router_topk", got_ids, router_ids_.download<int32_t>());
    c.equal("weight bits vs moe_router_topk", tw_.download<int32_t>(),
            router_w_.download<int32_t>());
    if (!s_.skip_align) {
      const std::string err =
          align_error(local_ids(got_ids, s_.expert0, s_.local_experts), sorted_.download<int32_t>(),
                      off_.download<int32_t>(), active_.download<int32_t>(), aligned());
      c.expect(err.empty(), "align: " + err);
    }
    c.expect(counter_.download<int32_t>()[0] == 0, "block counter left non-zero");
    return c;
  }
  // router weight and x read, logits and the routing written
  double bytes() const override {
    return 2.0 * s_.experts * s_.hidden + 2.0 * s_.tokens * s_.hidden + 4.0 * s_.tokens * s_.experts +
           12.0 * s_.tokens * s_.top_k;
  }
  double flops() const override { return 2.0 * s_.tokens * s_.experts * s_.hidden; }

 private:
  int aligned() const { return s_.local_experts > 0 ? s_.local_experts : s_.experts; }
  static constexpr float kNormEps = 1e-6f;
  RouteSmallShape s_;
  RandomBf16 x_, w_, res_, norm_w_;  // with the fused norm x_ is the branch added to res_
  DevBuf<bf16> normed_;
  DevBuf<float> logits_, tw_, router_w_;  // router_*: moe_router_topk on logits_, in check()
  DevBuf<int32_t> ids_, sorted_, off_, active_, counter_, router_ids_;
};

// gate+up (input rows = tokens) or down (input rows = pairs) through moe_align + one expert GEMM,
// the stacked expert weights [E · rows, cols] in the shape's format.
class MoeGemmCase final : public OpCase {
 public:
  explicit MoeGemmCase(const MoeGemmShape& s) : s_(s) {}
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    const int T = s_.tokens, E = s_.experts, H = s_.hidden, I = s_.inter, pairs = T * s_.top_k;
    hit_ = make_routings(rng, T, E, s_.top_k, s_.hot, s_.routings, routings_, ids0_);
    for (const Routing& r : routings_) kernels::moe_align(r.align(pairs, E), env.stream);
    const size_t rows = gate() ? 2 * I : H, cols = gate() ? H : I;
    switch (s_.format) {  // one place per weight format: its fill here, its decoded values in check()
      case WeightFormat::bf16:
        weight_ = RandomBf16(E * rows * cols, 0.05f, rng, env.stream);
        expert_bytes_ = 2.0 * rows * cols;
        break;
      case WeightFormat::fp8_block:
      case WeightFormat::nvfp4:
      case WeightFormat::int8:
      case WeightFormat::int4:
        qweight_ = RandomQuantMatrix(s_.format, static_cast<int64_t>(E * rows), static_cast<int64_t>(cols), 0.05f, rng);
        expert_bytes_ = qweight_.bytes() / E;  // values and the rows' scales
        break;
    }
    in_ = RandomBf16(static_cast<size_t>(gate() ? T : pairs) * cols, 1.f, rng, env.stream);
    if (s_.w8a8) {
      in_q_ = DevBuf<uint8_t>(in_rows() * cols);
      in_s_ = DevBuf<float>(in_rows() * (cols / kA8Group));
      kernels::quantize_fp8_rows(in_.get(), static_cast<int64_t>(in_rows()), static_cast<int>(cols), kA8Group,
                                 in_q_.get(), in_s_.get(), env.stream);
    }
    out_ = DevBuf<bf16>(static_cast<size_t>(pairs) * out_cols());
    out_.poison();
    if (s_.tma) kernels::moe_wgmma_prepare();
    if (s_.combine) {
      // the residual about as large as the sum, so that its rounding shows the sum's error
      residual_ = RandomBf16(static_cast<size_t>(H), 0.5f, rng, env.stream);
      std::uniform_real_distribution<float> u(0.05f, 0.3f);
      pair_w_.resize(static_cast<size_t>(pairs));
      for (float& w : pair_w_) w = u(rng);
      pair_w_dev_ = DevBuf<float>(pair_w_);
    }
  }
  void run(const OpEnv& env, int iter) override {
    const kernels::MoeGemmParams p = params(iter);
    if (s_.combine)
      kernels::moe_gemv_combine(p, residual_.get(), pair_w_dev_.get(), env.stream);
    else if (s_.gemv)
      kernels::moe_gemv(p, s_.tokens, env.stream);
    else if (s_.tma)
      kernels::moe_gemm_tma(p, env.stream);
    else
      s_.kernel(p, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const std::vector<double> ref = reference(env);
    OpCheck c;
    if (s_.combine) {
      check_combine(env, ref, tol, c);
      return c;
    }
    c.rel_l2("out", to_float(out_.download<uint16_t>()), ref, tol);  // tolerance: moe_gemm_case
    return c;
  }
  // weights of the experts hit once (at their stored size), input rows read, output rows written
  double bytes() const override {
    const double pairs = static_cast<double>(s_.tokens) * s_.top_k, H = s_.hidden, I = s_.inter;
    if (s_.combine) return hit_ * expert_bytes_ + 2.0 * pairs * I + 4.0 * H;
    if (!gate()) return hit_ * expert_bytes_ + 2.0 * pairs * I + 2.0 * pairs * H;
    return hit_ * expert_bytes_ + 2.0 * s_.tokens * H + 2.0 * pairs * out_cols();
  }
  double flops() const override { return 2.0 * s_.tokens * s_.top_k * 2 * s_.inter * s_.hidden / (gate() ? 1 : 2); }
  std::string note() const override {
    char b[32];
    std::snprintf(b, sizeof b, "experts hit %.1f", hit_);
    return b;
  }

 private:
  static constexpr int kA8Group = kernels::kMoeGemmA8Group;
  kernels::MoeGemmParams params(int iter) const {
    const Routing& r = routings_[iter % s_.routings];
    kernels::MoeGemmParams p;
    p.sorted_ids = r.sorted.get();
    p.expert_offsets = r.offsets.get();
    p.active_experts = s_.active_experts ? r.active.get() : nullptr;
    p.num_pairs = s_.tokens * s_.top_k;
    p.num_experts = s_.experts;
    p.out = out_.get();
    p.in = in_.get();
    if (s_.format == WeightFormat::bf16) {
      p.weight.codec = kernels::WeightCodec::Bf16;
      p.weight.data = weight_.get();
    } else {
      p.weight = qweight_.view();
    }
    p.in_row_div = gate() ? s_.top_k : 1;
    p.n = out_cols();
    p.k = gate() ? s_.hidden : s_.inter;
    p.silu_gate_up = s_.stage == MoeGemmStage::gate_up_silu;
    if (s_.w8a8) {
      p.in_fp8 = in_q_.get();
      p.in_scales = in_s_.get();
    }
    if (s_.direct) {
      p.sorted_ids = r.ids.get();
      p.direct_topk = true;
    }
    p.gemv_cuda_cores = s_.cuda_cores;
    p.routing_settled = s_.combine;  // the routing is the case's, complete before any launch
    return p;
  }
  // fp64 out [pairs, n_out] of the shape's stage on the weights as decoded
  std::vector<double> reference(const OpEnv& env) const {
    const int I = s_.inter, K = s_.top_k, pairs = s_.tokens * K, n_out = out_cols();
    const size_t k = gate() ? s_.hidden : I, rows = gate() ? 2 * I : s_.hidden;
    const std::vector<uint16_t> wb = s_.format == WeightFormat::bf16 ? weight_.original(env.stream) : std::vector<uint16_t>{};
    // W8A8: the e4m3 rows as the kernel reads them, decoded
    const auto in = s_.w8a8 ? decoded_in(k) : in_.original_f(env.stream);
    // Per expert hit: its weights decoded once (bf16 as stored; a compressed format from its
    // bytes, row scale included), then every pair routed to it in fp64.
    std::vector<std::vector<size_t>> pairs_of(s_.experts);
    for (int pr = 0; pr < pairs; ++pr) pairs_of[ids0_[pr]].push_back(pr);
    std::vector<double> ref(static_cast<size_t>(pairs) * n_out);
    parallel_for(pairs_of.size(), [&](size_t e) {
      if (pairs_of[e].empty()) return;
      std::vector<float> w(rows * k);
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < k; ++c)
          w[r * k + c] = s_.format == WeightFormat::bf16
                             ? bf2f(wb[(e * rows + r) * k + c])
                             : qweight_.value(static_cast<int64_t>(e * rows + r), static_cast<int64_t>(c));
      for (const size_t pr : pairs_of[e]) {
        const float* x = &in[(gate() ? pr / K : pr) * k];
        auto dot = [&](int row) {
          const float* wr = &w[row * k];
          double s = 0;
          for (size_t c = 0; c < k; ++c) s += static_cast<double>(x[c]) * wr[c];
          return s;
        };
        for (int n = 0; n < n_out; ++n) {
          double v = dot(n);
          if (s_.stage == MoeGemmStage::gate_up_silu) v = v / (1.0 + std::exp(-v)) * dot(I + n);
          ref[pr * n_out + n] = v;
        }
      }
    });
    return ref;
  }
  // moe_gemv_combine: the residual bitwise equal to the separate launches' (moe_gemv on the same
  // CUDA-core walk into expert rows, moe_combine_add_rmsnorm's combine and add, run here on a
  // copy of the original residual), and against fp64 residual + Σ w · rows (within the bf16
  // roundings of each row, the sum and the add: 5e-3)
  void check_combine(const OpEnv& env, const std::vector<double>& ref, double tol, OpCheck& c) {
    const int H = s_.hidden, pairs = s_.tokens * s_.top_k;
    const std::vector<uint16_t> res0 = residual_.original(env.stream), got = residual_.current();
    kernels::MoeGemmParams p = params(0);
    p.gemv_cuda_cores = true;
    kernels::moe_gemv(p, 1, env.stream);
    DevBuf<bf16> res_sep(res0), normed(static_cast<size_t>(H));
    DevBuf<bf16> norm_w(std::vector<uint16_t>(static_cast<size_t>(H), 0x3f80));  // 1.0
    kernels::MoeCombineParams cp{.out = nullptr, .expert_out = out_.get(), .weights = pair_w_dev_.get(),
                                 .tokens = 1, .top_k = pairs, .hidden = H};
    kernels::RmsNormParams np;
    np.residual = res_sep.get();
    np.out = normed.get();
    np.weight = norm_w.get();
    np.rows = 1;
    np.cols = H;
    np.eps = 1e-6f;
    kernels::moe_combine_add_rmsnorm(cp, np, env.stream);
    CUDA_CHECK(cudaStreamSynchronize(env.stream));
    c.equal("residual vs moe_gemv + moe_combine_add_rmsnorm", got, res_sep.download<uint16_t>());
    std::vector<double> total(static_cast<size_t>(H));
    for (int j = 0; j < H; ++j) total[j] = bf2f(res0[j]);
    for (int i = 0; i < pairs; ++i)
      for (int j = 0; j < H; ++j) total[j] += pair_w_[i] * ref[static_cast<size_t>(i) * H + j];
    c.rel_l2("residual vs fp64 residual + combine", to_float(got), total, std::max(tol, 5e-3));
  }
  bool gate() const { return s_.stage != MoeGemmStage::down; }
  size_t in_rows() const { return static_cast<size_t>(gate() ? s_.tokens : s_.tokens * s_.top_k); }
  int out_cols() const {
    return s_.stage == MoeGemmStage::gate_up ? 2 * s_.inter : s_.stage == MoeGemmStage::gate_up_silu ? s_.inter : s_.hidden;
  }
  std::vector<float> decoded_in(size_t k) const {
    const std::vector<uint8_t> q = in_q_.download<uint8_t>();
    const std::vector<float> sc = in_s_.download<float>();
    std::vector<float> x(in_rows() * k);
    for (size_t i = 0; i < x.size(); ++i) x[i] = fp8_e4m3_to_f32(q[i]) * sc[i / kA8Group];  // k % 128 == 0
    return x;
  }
  MoeGemmShape s_;
  std::vector<Routing> routings_;
  std::vector<int32_t> ids0_;
  double hit_ = 0;
  double expert_bytes_ = 0;  // one expert's weights as stored
  RandomBf16 weight_, in_;   // weight_: bf16 format
  RandomQuantMatrix qweight_;  // compressed formats
  DevBuf<uint8_t> in_q_;       // W8A8: e4m3 input rows and their scales
  DevBuf<float> in_s_;
  DevBuf<bf16> out_;
  RandomBf16 residual_;        // combine: [hidden], changed in place
  std::vector<float> pair_w_;  // combine: the pairs' weights
  DevBuf<float> pair_w_dev_;
};

// Sorted rows [cap, k] (every row random, padding rows too) and stacked bf16 weights [E, n, k];
// each expert's segment of the output vs fp64, and the rows past the last segment untouched.
// fp8 (W8A8, moe_wgmma_fp8): the rows quantized per 1 × 128 by quantize_fp8_rows, FP8-block
// weights; the reference multiplies the decoded values in fp64, so only the kernel's fp32 sums
// and its output rounding differ. gate+up then writes e4m3 activations: decoded vs the fp64
// silu(gate)·up within e4m3's rounding (3 mantissa bits: ≤ 2^-4 relative per value; rel. L2 0.04,
// the bound of quantize_fp8_rows' own case), and each scale = the group's amax / 448 (1e-3).
class SortedExpertGemmCase final : public OpCase {
 public:
  explicit SortedExpertGemmCase(const SortedExpertGemmShape& s) : s_(s) {}
  ~SortedExpertGemmCase() override { cudaFreeHost(ptrs_host_); }
  void setup(const OpEnv& env, uint32_t seed) override {
    std::mt19937 rng(seed);
    hit_ = make_routings(rng, s_.tokens, s_.experts, s_.top_k, s_.hot, 1, routings_, ids0_);
    kernels::moe_align(routings_[0].align(s_.tokens * s_.top_k, s_.experts), env.stream);
    offsets_ = routings_[0].offsets.download<int32_t>();
    in_ = RandomBf16(static_cast<size_t>(in_rows()) * k(), 1.f, rng, env.stream);
    if (s_.gather) {
      row_of_pair_ = DevBuf<int32_t>(pairs());
      row_of_pair_.poison();
    }
    if (!s_.cublas) kernels::moe_wgmma_prepare();
    if (s_.fp8) {
      if (s_.block_scales) {
        // bf16 weights quantized in 128 × 128 blocks, as FP8 checkpoints hold them
        weight_ = RandomBf16(static_cast<size_t>(s_.experts) * n() * k(), 0.05f, rng, env.stream);
        wb_q_ = DevBuf<uint8_t>(static_cast<size_t>(s_.experts) * n() * k());
        wb_s_ = DevBuf<float>(static_cast<size_t>(s_.experts) * n() * groups(k()));
        kernels::quantize_fp8_rows(weight_.get(), static_cast<int64_t>(s_.experts) * n(), k(),
                                   kernels::kWgmmaFp8Group, wb_q_.get(), wb_s_.get(), env.stream,
                                   kernels::kWgmmaFp8Group);
      } else {
        wq_ = RandomQuantMatrix(WeightFormat::fp8_block, static_cast<int64_t>(s_.experts) * n(), k(), 0.05f, rng);
      }
      in_q_ = DevBuf<uint8_t>(static_cast<size_t>(in_rows()) * k());
      in_s_ = DevBuf<float>(static_cast<size_t>(in_rows()) * groups(k()));
      kernels::quantize_fp8_rows(in_.get(), in_rows(), k(), kernels::kWgmmaFp8Group, in_q_.get(), in_s_.get(),
                                 env.stream);
      if (gate()) {
        out_q_ = DevBuf<uint8_t>(static_cast<size_t>(cap()) * out_cols());
        out_s_ = DevBuf<float>(static_cast<size_t>(cap()) * groups(out_cols()));
        out_q_.poison();
        out_s_.poison();
      }
    } else {
      weight_ = RandomBf16(static_cast<size_t>(s_.experts) * n() * k(), 0.05f, rng, env.stream);
    }
    if (!(s_.fp8 && gate())) {
      out_ = DevBuf<bf16>(static_cast<size_t>(cap()) * out_cols());
      out_.poison();
    }
    if (s_.cublas) {
      gate_up_ = DevBuf<bf16>(gate() ? static_cast<size_t>(cap()) * n() : 1);
      ptr_dev_ = DevBuf<const void*>(3 * static_cast<size_t>(s_.experts));
      CUDA_CHECK(cudaMallocHost(&ptrs_host_, 3 * static_cast<size_t>(s_.experts) * sizeof(void*)));
    }
  }
  void run(const OpEnv& env, int) override {
    if (s_.fp8) {
      const kernels::QuantMatrix w = s_.block_scales ? kernels::QuantMatrix{} : wq_.view();
      kernels::MoeWgmmaFp8Params p{
          .out = gate() ? static_cast<void*>(out_q_.get()) : static_cast<void*>(out_.get()),
          .out_scales = gate() ? out_s_.get() : nullptr, .in = in_q_.get(), .in_scales = in_s_.get(),
          .weight = s_.block_scales ? wb_q_.get() : static_cast<const uint8_t*>(w.data),
          .weight_scales = s_.block_scales ? wb_s_.get() : static_cast<const float*>(w.scales),
          .weight_scale_rows = s_.block_scales ? kernels::kWgmmaFp8Group : 1,
          .expert_offsets = routings_[0].offsets.get(), .num_experts = s_.experts, .n = n(), .k = k(),
          .rows_cap = cap(), .silu_gate_up = gate(), .max_blocks = s_.max_blocks};
      set_gather(p);
      kernels::moe_wgmma_fp8(p, env.stream);
      return;
    }
    if (!s_.cublas) {
      kernels::MoeWgmmaParams p{.out = out_.get(), .in = in_.get(), .weight = weight_.get(),
                                .expert_offsets = routings_[0].offsets.get(), .num_experts = s_.experts,
                                .n = n(), .k = k(), .rows_cap = cap(), .silu_gate_up = gate(),
                                .tma_rows = s_.tma_rows, .max_blocks = s_.max_blocks};
      set_gather(p);
      kernels::moe_wgmma(p, env.stream);
      return;
    }
    std::vector<bf16*> outs;
    std::vector<const bf16*> xs, ws;
    std::vector<int> ms;
    bf16* dst = gate() ? gate_up_.get() : out_.get();
    for (int e = 0; e < s_.experts; ++e) {
      const int row0 = offsets_[e], rows = offsets_[e + 1] - row0;
      if (rows == 0) continue;
      outs.push_back(dst + static_cast<size_t>(row0) * n());
      xs.push_back(in_.get() + static_cast<size_t>(row0) * k());
      ws.push_back(weight_.get() + static_cast<size_t>(e) * n() * k());
      ms.push_back(rows);
    }
    kernels::linear_grouped(env.cublas, env.stream, outs.data(), xs.data(), ws.data(), ms.data(),
                            static_cast<int>(ms.size()), n(), k(), ptrs_host_, ptr_dev_.get());
    if (gate()) kernels::silu_mul(out_.get(), gate_up_.get(), offsets_[s_.experts], s_.inter, env.stream);
  }
  OpCheck check(const OpEnv& env, double tol) override {
    const std::vector<float> x = s_.fp8 ? decoded_rows() : in_.original_f(env.stream);
    const std::vector<float> w = s_.fp8 ? decoded_weights() : weight_.original_f(env.stream);
    const int total = offsets_[s_.experts], cols = out_cols(), K = k();
    const std::vector<int32_t> sorted = s_.gather ? routings_[0].sorted.download<int32_t>() : std::vector<int32_t>{};
    std::vector<double> ref(static_cast<size_t>(total) * cols);
    const std::vector<float> zeros(K, 0.f);
    parallel_for(static_cast<size_t>(total), [&](size_t row) {
      const int e = static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), static_cast<int>(row)) -
                                     offsets_.begin()) - 1;
      // gathered: the pair's token row, zeros for padding
      const float* xr = !s_.gather ? &x[row * K]
                        : sorted[row] < pairs() ? &x[static_cast<size_t>(sorted[row] / s_.top_k) * K]
                                                : zeros.data();
      auto dot = [&](int wrow) {
        const float* wr = &w[(static_cast<size_t>(e) * n() + wrow) * K];
        double acc = 0;
        for (int c = 0; c < K; ++c) acc += static_cast<double>(xr[c]) * wr[c];
        return acc;
      };
      for (int c = 0; c < cols; ++c) {
        double v = dot(c);
        if (gate()) v = v / (1.0 + std::exp(-v)) * dot(s_.inter + c);
        ref[row * cols + c] = v;
      }
    });
    OpCheck c;
    if (s_.fp8 && gate()) {
      check_fp8_activations(c, ref, total);
    } else {
      const std::vector<uint16_t> got = out_.download<uint16_t>();
      const std::vector<uint16_t> segments(got.begin(), got.begin() + static_cast<ptrdiff_t>(ref.size()));
      c.rel_l2("expert rows", to_float(segments), ref, tol);
      const std::vector<uint16_t> rest(got.begin() + static_cast<ptrdiff_t>(ref.size()), got.end());
      c.equal("rows past the segments", rest, std::vector<uint16_t>(rest.size(), 0xffff));
    }
    if (s_.gather) {
      std::vector<int32_t> want(pairs(), -1);
      for (int i = 0; i < total; ++i)
        if (sorted[i] < pairs()) want[sorted[i]] = i;
      c.equal("row_of_pair", row_of_pair_.download<int32_t>(), want);
    }
    return c;
  }
  // every expert hit reads its weights once, the rows in and out once (fp8: bytes, scales aside)
  double bytes() const override {
    const double elem = s_.fp8 ? 1.0 : 2.0;
    return hit_ * elem * n() * k() + elem * offsets_.back() * k() + (s_.fp8 && gate() ? 1.0 : 2.0) * offsets_.back() * out_cols();
  }
  double flops() const override { return 2.0 * offsets_.back() * n() * k(); }
  std::string note() const override {
    char b[48];
    std::snprintf(b, sizeof b, "rows %d, experts hit %.1f", offsets_.back(), hit_);
    return b;
  }

 private:
  bool gate() const { return s_.stage != MoeGemmStage::down; }
  int n() const { return gate() ? 2 * s_.inter : s_.hidden; }
  int k() const { return gate() ? s_.hidden : s_.inter; }
  int out_cols() const { return gate() ? s_.inter : s_.hidden; }
  int pairs() const { return s_.tokens * s_.top_k; }
  int cap() const { return kernels::moe_align_capacity(pairs(), s_.experts, kMoeGemmTileM); }
  int in_rows() const { return s_.gather ? s_.tokens : cap(); }
  // The gather operands of either wgmma kernel's params (the engine's gate+up stage).
  template <class Params>
  void set_gather(Params& p) const {
    if (!s_.gather) return;
    p.sorted_ids = routings_[0].sorted.get();
    p.num_pairs = pairs();
    p.in_row_div = s_.top_k;
    p.row_of_pair = row_of_pair_.get();
  }
  static int groups(int cols) { return (cols + kernels::kWgmmaFp8Group - 1) / kernels::kWgmmaFp8Group; }

  // The first `rows` rows of e4m3 codes [.., cols] with a scale per row and 128-group, decoded.
  static std::vector<float> decode_e4m3(const std::vector<uint8_t>& q, const std::vector<float>& sc, size_t rows,
                                        int cols) {
    std::vector<float> x(rows * cols);
    const int G = groups(cols);
    parallel_for(rows, [&](size_t r) {
      for (int c = 0; c < cols; ++c)
        x[r * cols + c] = fp8_e4m3_to_f32(q[r * cols + c]) * sc[r * G + c / kernels::kWgmmaFp8Group];
    });
    return x;
  }
  // The e4m3 input rows as the kernel reads them, decoded.
  std::vector<float> decoded_rows() const {
    return decode_e4m3(in_q_.download<uint8_t>(), in_s_.download<float>(), static_cast<size_t>(in_rows()), k());
  }
  std::vector<float> decoded_weights() const {
    const int64_t rows = static_cast<int64_t>(s_.experts) * n(), K = k();
    if (s_.block_scales)
      return decode_e4m3(wb_q_.download<uint8_t>(), wb_s_.download<float>(), static_cast<size_t>(rows), k());
    std::vector<float> w(static_cast<size_t>(rows * K));
    parallel_for(static_cast<size_t>(rows), [&](size_t r) {
      for (int64_t c = 0; c < K; ++c) w[r * K + c] = wq_.value(static_cast<int64_t>(r), c);
    });
    return w;
  }
  // gate+up's e4m3 output: decoded values vs ref, scales vs each group's amax / 448, and the
  // rows past the last segment untouched.
  void check_fp8_activations(OpCheck& c, const std::vector<double>& ref, int total) const {
    const std::vector<uint8_t> q = out_q_.download<uint8_t>();
    const std::vector<float> sc = out_s_.download<float>();
    const int cols = out_cols(), G = groups(cols);
    const std::vector<float> got = decode_e4m3(q, sc, static_cast<size_t>(total), cols);
    std::vector<double> scale_ref(static_cast<size_t>(total) * G);
    for (size_t r = 0; r < static_cast<size_t>(total); ++r)
      for (int g = 0; g < G; ++g) {
        double amax = 0;
        for (int i = g * kernels::kWgmmaFp8Group; i < std::min(cols, (g + 1) * kernels::kWgmmaFp8Group); ++i)
          amax = std::max(amax, std::fabs(ref[r * cols + i]));
        scale_ref[r * G + g] = amax > 0 ? amax / 448.0 : 1.0;
      }
    c.rel_l2("expert rows (e4m3 decoded)", got, ref, 0.04);
    c.rel_l2("scales", std::vector<float>(sc.begin(), sc.begin() + static_cast<ptrdiff_t>(scale_ref.size())),
             scale_ref, 1e-3);
    const std::vector<int32_t> rest(q.begin() + static_cast<ptrdiff_t>(ref.size()), q.end());
    c.equal("rows past the segments", rest, std::vector<int32_t>(rest.size(), 0xff));
  }
  SortedExpertGemmShape s_;
  std::vector<Routing> routings_;
  std::vector<int32_t> ids0_, offsets_;
  double hit_ = 0;
  RandomBf16 in_, weight_;
  RandomQuantMatrix wq_;             // fp8: the weights
  DevBuf<uint8_t> in_q_, out_q_;     // fp8: e4m3 rows in, gate+up's e4m3 activations out
  DevBuf<float> in_s_, out_s_;       //      and their scales
  DevBuf<uint8_t> wb_q_;             // fp8 with block scales: the weights quantized in 128 × 128
  DevBuf<float> wb_s_;               //      blocks, and their scales
  DevBuf<bf16> out_, gate_up_;
  DevBuf<int32_t> row_of_pair_;
  DevBuf<const void*> ptr_dev_;
  const void** ptrs_host_ = nullptr;
};

std::string experts(int tokens, int E, int K, int hot) {
  return "t" + to_string(tokens) + " E" + to_string(E) + " k" + to_string(K) + (hot >= 0 ? " hot" + to_string(hot) : "");
}

}  // namespace

OpCaseDef router_case(const RouterShape& s) {
  return op_case_def<RouterCase>("router_topk",
                                 experts(s.tokens, s.experts, s.top_k, -1) + (s.renormalize ? " renorm" : " no-renorm") +
                                     (s.bf16_logits ? " bf16" : " fp32"),
                                 OpFamily::moe_routing, 1e-5, s);
}

OpCaseDef align_case(const AlignShape& s) {
  MB_CHECK(s.routings >= 1, "moe_align case: at least one routing");
  MB_CHECK(s.local_experts == 0 || s.expert0 + s.local_experts <= s.experts, "moe_align case: bad expert range");
  return op_case_def<AlignCase>("moe_align",
                                experts(s.tokens, s.experts, s.top_k, s.hot) + local_range(s.expert0, s.local_experts) +
                                    (s.one_block ? " one-block" : ""),
                                OpFamily::moe_routing, 0, s);
}

OpCaseDef gather_sorted_case(const GatherSortedShape& s) {
  return op_case_def<GatherSortedCase>("moe_gather_sorted", experts(s.tokens, s.experts, s.top_k, s.hot),
                                       OpFamily::moe_routing, 0, s);
}

OpCaseDef route_small_case(const RouteSmallShape& s) {
  MB_CHECK(s.local_experts == 0 || s.expert0 + s.local_experts <= s.experts, "moe_route_small case: bad expert range");
  MB_CHECK(s.tie_period >= 0 && s.tie_period < s.experts,
           "moe_route_small case: tie_period must leave copies");
  OpCaseDef d = op_case_def<RouteSmallCase>(
      "moe_route_small",
      experts(s.tokens, s.experts, s.top_k, -1) + " H" + to_string(s.hidden) + (s.renormalize ? " renorm" : " no-renorm") +
          local_range(s.expert0, s.local_experts) + (s.norm ? " add+norm" : "") + (s.skip_align ? " no-align" : "") +
          (s.tie_period > 0 ? " tie" + to_string(s.tie_period) : "") + (s.cluster ? " cluster" : ""),
      OpFamily::moe_routing, 1e-5, s);
  if (s.cluster) d.available = [](int) { return kernels::moe_route_small_prepare_cluster(); };  // current device
  return d;
}

OpCaseDef moe_gemm_case(const MoeGemmShape& s) {
  MB_CHECK(s.routings >= 1 && s.kernel != nullptr, "moe_gemm case: needs a kernel and a routing");
  const char* stage = s.stage == MoeGemmStage::gate_up ? "gate_up" : s.stage == MoeGemmStage::gate_up_silu ? "gate_up+silu" : "down";
  // bf16: fp32 accumulation of bf16 products; the bf16 output rounding dominates (SiLU·mul: one
  // rounding of the fp32 result): 5e-3. nvfp4 decodes exactly (E2M1 · E4M3 fits bf16; the row
  // scale multiplies the fp32 accumulator): the same. fp8, int8, int4: each weight (code · scale
  // − min) is also rounded once to bf16 (≤ 2^-8 relative per weight, independent across a dot
  // product): + 2^-8 (the grouped GEMV sums in fp32 without that rounding).
  const bool rounded = s.format == WeightFormat::fp8_block || s.format == WeightFormat::int8 ||
                       s.format == WeightFormat::int4;
  // W8A8: products of the decoded e4m3 operands are exact, each window's fp32 sum scaled once: 5e-3.
  const double tol = rounded && !s.w8a8 ? 5e-3 + 0x1p-8 : 5e-3;
  MB_CHECK(!s.w8a8 || (s.format == WeightFormat::fp8_block && !s.gemv), "moe_gemm case: W8A8 is the fp8 grouped GEMM's");
  MB_CHECK(!s.gemv || (s.active_experts && s.tokens <= kernels::kMoeGemvMaxTokens),
           "moe_gemm case: moe_gemv needs the active list and few tokens");
  MB_CHECK(!s.tma || ((s.format == WeightFormat::bf16 || s.w8a8) && !s.gemv),
           "moe_gemm case: moe_gemm_tma is the tiled GEMM of bf16 and of W8A8");
  MB_CHECK(!s.direct || (s.gemv && s.tokens == 1), "moe_gemm case: direct_topk is moe_gemv's, one token");
  MB_CHECK(!s.cuda_cores || (s.gemv && (s.format == WeightFormat::nvfp4 || s.format == WeightFormat::int4)),
           "moe_gemm case: the CUDA-core walk is the 4-bit moe_gemv's alternative");
  MB_CHECK(!s.combine || (s.stage == MoeGemmStage::down && s.gemv && s.direct && s.active_experts && !s.w8a8 &&
                          !s.cuda_cores && s.top_k <= kernels::kMoeGemvCombineMaxPairs),
           "moe_gemm case: moe_gemv_combine is one token's down stage (direct, the active list for its check)");
  std::string name =
      std::string(s.combine ? "moe_gemv_combine" : s.gemv ? "moe_gemv" : s.tma ? "moe_gemm_tma" : s.kernel_name) +
      " " + stage;
  if (s.format != WeightFormat::bf16) name += std::string(" ") + weight_format_name(s.format);
  if (s.w8a8) name += " w8a8";
  if (s.direct) name += " direct";
  if (s.cuda_cores) name += " cuda-cores";
  OpCaseDef d = op_case_def<MoeGemmCase>(name,
                                         experts(s.tokens, s.experts, s.top_k, s.hot) + " H" + to_string(s.hidden) +
                                             " I" + to_string(s.inter) + (s.active_experts ? " active" : ""),
                                         OpFamily::moe_gemm, tol, s);
  d.format = s.format;
  if (s.tma) d.available = &kernels::moe_gemm_tma_available;
  return d;
}

OpCaseDef sorted_expert_gemm_case(const SortedExpertGemmShape& s) {
  MB_CHECK(s.stage != MoeGemmStage::gate_up, "sorted expert GEMM case: gate_up_silu or down");
  MB_CHECK(!(s.gather && s.cublas), "sorted expert GEMM case: the cuBLAS path gathers beforehand");
  MB_CHECK(!(s.fp8 && s.cublas), "sorted expert GEMM case: W8A8 is the wgmma kernel's");
  MB_CHECK(!s.block_scales || s.fp8, "sorted expert GEMM case: block scales are W8A8's");
  MB_CHECK(!s.tma_rows || (!s.fp8 && !s.cublas), "sorted expert GEMM case: TMA rows are the bf16 wgmma kernel's");
  MB_CHECK(!(s.tma_rows && s.gather), "sorted expert GEMM case: TMA rows are sorted rows, not gathered");
  MB_CHECK(s.max_blocks == 0 || !s.cublas, "sorted expert GEMM case: a block cap is the wgmma kernels'");
  const char* stage = s.stage == MoeGemmStage::down ? "down" : "gate_up+silu";
  // fp32 accumulation of bf16 products, one bf16 rounding of the result (SiLU·mul from fp32 on
  // the wgmma path; cuBLAS rounds gate and up to bf16 first, a second rounding): 5e-3.
  // The cuBLAS peer is in the gemm family: the cases that get a cuBLAS handle.
  OpCaseDef d = op_case_def<SortedExpertGemmCase>(
      std::string(s.cublas ? "moe_sorted cuBLAS " : s.fp8 ? "moe_wgmma_fp8 " : "moe_wgmma ") + stage +
          (s.gather ? " gather" : "") + (s.block_scales ? " block-scales" : "") + (s.tma_rows ? " tma-rows" : "") +
          (s.max_blocks > 0 ? " blocks" + to_string(s.max_blocks) : ""),
      experts(s.tokens, s.experts, s.top_k, s.hot) + " H" + to_string(s.hidden) + " I" + to_string(s.inter),
      s.cublas ? OpFamily::gemm : OpFamily::moe_gemm, 5e-3, s);
  if (!s.cublas) d.available = &kernels::moe_wgmma_available;
  return d;
}

}  // namespace moebatch::ops
