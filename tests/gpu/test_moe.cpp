// MoE router, alignment and the grouped expert GEMM against CPU references on fresh random
// inputs, including an expert that receives more rows than one GEMM pass holds.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/moe_gemm.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/random.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace moebatch::test {
namespace {

using namespace moebatch::kernels;

class MoeTest : public GpuTest {};

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

TEST_F(MoeTest, RouterTopKMatchesReference) {
  SCOPED_TRACE(trace());
  for (int E : {128, 16, 60}) {
    for (bool renorm : {true, false}) {
      for (bool bf16_logits : {false, true}) {
        SCOPED_TRACE("E " + std::to_string(E) + " renorm " + std::to_string(renorm) + " bf16 " + std::to_string(bf16_logits));
        const int tokens = 67, K = E >= 64 ? 8 : 4;
        std::normal_distribution<float> nd(0.f, 2.f);
        std::vector<float> logits(static_cast<size_t>(tokens) * E);
        for (auto& v : logits) v = bf16_logits ? round_bf(nd(rng)) : nd(rng);
        std::vector<uint16_t> lb(logits.size());
        for (size_t i = 0; i < lb.size(); ++i) lb[i] = f2bf(logits[i]);
        DevBuf<float> d_lf(logits), d_w(static_cast<size_t>(tokens) * K);
        DevBuf<bf16> d_lb(lb);
        DevBuf<int32_t> d_ids(static_cast<size_t>(tokens) * K);
        d_w.poison();
        d_ids.poison();
        RouterParams p;
        p.topk_ids = d_ids.get();
        p.topk_weights = d_w.get();
        p.tokens = tokens;
        p.num_experts = E;
        p.top_k = K;
        p.renormalize = renorm;
        if (bf16_logits) moe_router_topk(p, d_lb.get(), stream); else moe_router_topk(p, d_lf.get(), stream);
        sync();
        std::vector<int32_t> ids;
        std::vector<double> w;
        router_ref(logits, tokens, E, K, renorm, ids, w);
        EXPECT_EQ(d_ids.download<int32_t>(), ids);
        EXPECT_TRUE(close_rel_l2(d_w.download<float>(), w, 1e-5));
      }
    }
  }
}

// Random distinct experts per token; optionally every token also picks `hot` (skewed load).
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

struct Aligned {
  std::vector<int32_t> sorted, offsets, active;
};

// `d_active` ([E + 1], optional) receives the active-expert list.
Aligned run_align(cudaStream_t stream, const DevBuf<int32_t>& d_ids, int pairs, int E,
                  DevBuf<int32_t>& d_sorted, DevBuf<int32_t>& d_off,
                  DevBuf<int32_t>* d_active = nullptr) {
  AlignParams a;
  a.active_experts = d_active ? d_active->get() : nullptr;
  a.sorted_ids = d_sorted.get();
  a.expert_offsets = d_off.get();
  a.topk_ids = d_ids.get();
  a.num_pairs = pairs;
  a.num_experts = E;
  a.block_m = kMoeGemmTileM;
  moe_align(a, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return {d_sorted.download<int32_t>(), d_off.download<int32_t>(),
          d_active ? d_active->download<int32_t>() : std::vector<int32_t>{}};
}

TEST_F(MoeTest, AlignGroupsPairsByExpertWithPadding) {
  SCOPED_TRACE(trace());
  for (int tokens : {1, 64, 300}) {
    const int E = 128, K = 8, pairs = tokens * K;
    const auto ids = random_routing(rng, tokens, E, K, tokens == 300 ? 5 : -1);
    DevBuf<int32_t> d_ids(ids), d_sorted(moe_align_capacity(pairs, E, kMoeGemmTileM)), d_off(E + 1);
    DevBuf<int32_t> d_active(E + 1);
    d_sorted.poison();
    d_active.poison();
    const auto al = run_align(stream, d_ids, pairs, E, d_sorted, d_off, &d_active);
    ASSERT_EQ(al.offsets[0], 0);
    std::vector<int32_t> want_active;
    for (int e = 0; e < E; ++e)
      if (std::count(ids.begin(), ids.end(), e) > 0) want_active.push_back(e);
    ASSERT_EQ(al.active[0], static_cast<int32_t>(want_active.size()));
    ASSERT_EQ(std::vector<int32_t>(al.active.begin() + 1, al.active.begin() + 1 + want_active.size()), want_active);
    for (int e = 0; e < E; ++e) {
      std::vector<int32_t> want;
      for (int i = 0; i < pairs; ++i)
        if (ids[i] == e) want.push_back(i);
      const int len = al.offsets[e + 1] - al.offsets[e];
      ASSERT_EQ(len, (static_cast<int>(want.size()) + kMoeGemmTileM - 1) / kMoeGemmTileM * kMoeGemmTileM) << "expert " << e;
      std::vector<int32_t> got(al.sorted.begin() + al.offsets[e], al.sorted.begin() + al.offsets[e] + want.size());
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got, want) << "expert " << e;
      for (int i = al.offsets[e] + static_cast<int>(want.size()); i < al.offsets[e + 1]; ++i)
        ASSERT_EQ(al.sorted[i], pairs) << "padding of expert " << e;
    }
  }
}

// gate+up (input rows = tokens) then down (input rows = pairs) through align + moe_gemm.
void gemm_case(GpuTest& t, std::mt19937& rng, cudaStream_t stream, int tokens, int E, int K,
               int H, int I, int hot, bool split_k = false) {
  SCOPED_TRACE("tokens " + std::to_string(tokens) + " E " + std::to_string(E) + " H " + std::to_string(H));
  (void)t;
  const int pairs = tokens * K;
  const auto ids = random_routing(rng, tokens, E, K, hot);
  auto x = random_bf16(rng, static_cast<size_t>(tokens) * H, 1.f);
  auto act = random_bf16(rng, static_cast<size_t>(pairs) * I, 1.f);
  // Expert stacks are large: generate them on the device from fresh seeds, then copy back.
  DevBuf<bf16> d_wgu(static_cast<size_t>(E) * 2 * I * H), d_wd(static_cast<size_t>(E) * H * I);
  fill_uniform(d_wgu.get(), d_wgu.size(), rng(), 0.05f, stream);
  fill_uniform(d_wd.get(), d_wd.size(), rng(), 0.05f, stream);
  const auto wgu = d_wgu.download<uint16_t>();
  const auto wd = d_wd.download<uint16_t>();
  DevBuf<int32_t> d_ids(ids), d_sorted(moe_align_capacity(pairs, E, kMoeGemmTileM)), d_off(E + 1);
  DevBuf<int32_t> d_active(E + 1);
  run_align(stream, d_ids, pairs, E, d_sorted, d_off, &d_active);
  DevBuf<bf16> d_x(x), d_act(act);
  DevBuf<bf16> d_gu(static_cast<size_t>(pairs) * 2 * I), d_down(static_cast<size_t>(pairs) * H);
  DevBuf<bf16> d_swiglu(static_cast<size_t>(pairs) * I);
  d_gu.poison();
  d_down.poison();
  d_swiglu.poison();
  auto* run = split_k ? &moe_gemm_split_k : &moe_gemm;
  MoeGemmParams p;
  p.sorted_ids = d_sorted.get();
  p.expert_offsets = d_off.get();
  p.num_pairs = pairs;
  p.num_experts = E;
  p.out = d_gu.get();
  p.in = d_x.get();
  p.weight = d_wgu.get();
  p.in_row_div = K;
  p.n = 2 * I;
  p.k = H;
  run(p, stream);
  p.out = d_swiglu.get();
  p.n = I;
  p.silu_gate_up = true;
  p.active_experts = d_active.get();  // the engine's launches: blocks only for experts with pairs
  run(p, stream);
  p.silu_gate_up = false;
  p.out = d_down.get();
  p.in = d_act.get();
  p.weight = d_wd.get();
  p.in_row_div = 1;
  p.n = H;
  p.k = I;
  run(p, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ref_gu(d_gu.size()), ref_down(d_down.size()), ref_swiglu(d_swiglu.size());
  const auto xf = to_float(x), wguf = to_float(wgu), actf = to_float(act), wdf = to_float(wd);
  for (int pr = 0; pr < pairs; ++pr) {
    const size_t e = ids[pr];
    for (int n = 0; n < 2 * I; ++n) {
      double s = 0;
      const float* w = &wguf[(e * 2 * I + n) * H];
      const float* xr = &xf[static_cast<size_t>(pr / K) * H];
      for (int k = 0; k < H; ++k) s += static_cast<double>(xr[k]) * w[k];
      ref_gu[static_cast<size_t>(pr) * 2 * I + n] = s;
    }
    for (int i = 0; i < I; ++i) {
      const double gate = ref_gu[static_cast<size_t>(pr) * 2 * I + i];
      const double up = ref_gu[static_cast<size_t>(pr) * 2 * I + I + i];
      ref_swiglu[static_cast<size_t>(pr) * I + i] = gate / (1.0 + std::exp(-gate)) * up;
    }
    for (int n = 0; n < H; ++n) {
      double s = 0;
      const float* w = &wdf[(e * H + n) * I];
      const float* ar = &actf[static_cast<size_t>(pr) * I];
      for (int k = 0; k < I; ++k) s += static_cast<double>(ar[k]) * w[k];
      ref_down[static_cast<size_t>(pr) * H + n] = s;
    }
  }
  // fp32 accumulation of bf16 products; the bf16 output rounding dominates.
  EXPECT_TRUE(close_rel_l2(to_float(d_gu.download<uint16_t>()), ref_gu, 5e-3)) << "gate_up";
  EXPECT_TRUE(close_rel_l2(to_float(d_down.download<uint16_t>()), ref_down, 5e-3)) << "down";
  // fused SiLU·mul epilogue: one rounding of the fp32 result
  EXPECT_TRUE(close_rel_l2(to_float(d_swiglu.download<uint16_t>()), ref_swiglu, 5e-3)) << "gate_up + silu";
}

TEST_F(MoeTest, GroupedGemmSmallShapes) {
  SCOPED_TRACE(trace());
  gemm_case(*this, rng, stream, 9, 16, 4, 128, 64, -1);    // qwen2_moe_tiny-like
  gemm_case(*this, rng, stream, 50, 16, 4, 128, 128, 2);   // one expert with 50 rows: two passes
  gemm_case(*this, rng, stream, 3, 8, 2, 96, 64, -1);      // k not a multiple of the 256 chunk
  gemm_case(*this, rng, stream, 40, 8, 2, 608, 96, 1);     // 3 chunks (last partial), hot expert: 2 passes
}

// Split-K variant: an expert with two tiles, a partial last warp range of k, a hot expert
// holding a full tile, the Qwen3 shape at batch 1 and 8, a 50-row expert (7 tiles).
TEST_F(MoeTest, GroupedGemmSplitKShapes) {
  SCOPED_TRACE(trace());
  gemm_case(*this, rng, stream, 9, 16, 4, 128, 64, -1, true);    // 9 rows: two tiles
  gemm_case(*this, rng, stream, 5, 8, 2, 608, 96, 1, true);      // k = 19 steps: warps get 5, 5, 5, 4
  gemm_case(*this, rng, stream, 8, 16, 8, 256, 128, 3, true);    // 64 pairs, expert 3 has 8 rows
  gemm_case(*this, rng, stream, 3, 8, 2, 96, 64, -1, true);      // 3 steps: the last warp idle
  gemm_case(*this, rng, stream, 50, 16, 4, 128, 128, 2, true);
  gemm_case(*this, rng, stream, 1, 128, 8, 2048, 768, -1, true);
  gemm_case(*this, rng, stream, 8, 128, 8, 2048, 768, -1, true);
}

// Fused small-batch router vs the three-launch contract: logits vs fp64, then top-k exactly as
// router_ref on the kernel's own fp32 logits, and the alignment of those ids. Repeated launches
// check that the block counter is left at zero.
TEST_F(MoeTest, RouteSmallMatchesReference) {
  SCOPED_TRACE(trace());
  DevBuf<int32_t> d_counter(1);
  CUDA_CHECK(cudaMemset(d_counter.get(), 0, sizeof(int32_t)));
  for (int E : {128, 60, 16}) {
    for (int tokens : {1, 3, 8}) {
      for (bool renorm : {true, false}) {
        SCOPED_TRACE("E " + std::to_string(E) + " tokens " + std::to_string(tokens) + " renorm " + std::to_string(renorm));
        const int K = E >= 64 ? 8 : 4, H = E == 60 ? 1000 : 2048, pairs = tokens * K;
        const auto x = random_bf16(rng, static_cast<size_t>(tokens) * H, 1.f);
        const auto w = random_bf16(rng, static_cast<size_t>(E) * H, 0.1f);
        DevBuf<bf16> d_x(x), d_w(w);
        DevBuf<float> d_logits(static_cast<size_t>(tokens) * E), d_tw(pairs);
        DevBuf<int32_t> d_ids(pairs), d_sorted(moe_align_capacity(pairs, E, kMoeGemmTileM)), d_off(E + 1),
            d_active(E + 1);
        for (auto* b : {&d_ids, &d_sorted, &d_off, &d_active}) b->poison();
        d_logits.poison();
        d_tw.poison();
        RouteSmallParams p;
        p.router.topk_ids = d_ids.get();
        p.router.topk_weights = d_tw.get();
        p.router.tokens = tokens;
        p.router.num_experts = E;
        p.router.top_k = K;
        p.router.renormalize = renorm;
        p.align.sorted_ids = d_sorted.get();
        p.align.expert_offsets = d_off.get();
        p.align.topk_ids = d_ids.get();
        p.align.num_pairs = pairs;
        p.align.num_experts = E;
        p.align.block_m = kMoeGemmTileM;
        p.align.active_experts = d_active.get();
        p.x = d_x.get();
        p.weight = d_w.get();
        p.logits = d_logits.get();
        p.hidden = H;
        p.counter = d_counter.get();
        moe_route_small(p, stream);
        sync();
        const auto logits = d_logits.download<float>();
        std::vector<double> ref_logits(logits.size());
        const auto xf = to_float(x), wf = to_float(w);
        for (int t = 0; t < tokens; ++t)
          for (int e = 0; e < E; ++e) {
            double s = 0;
            for (int k = 0; k < H; ++k) s += static_cast<double>(xf[static_cast<size_t>(t) * H + k]) * wf[static_cast<size_t>(e) * H + k];
            ref_logits[static_cast<size_t>(t) * E + e] = s;
          }
        EXPECT_TRUE(close_rel_l2(logits, ref_logits, 1e-5)) << "logits";
        std::vector<int32_t> ids;
        std::vector<double> wref;
        router_ref(logits, tokens, E, K, renorm, ids, wref);
        const auto got_ids = d_ids.download<int32_t>();
        EXPECT_EQ(got_ids, ids);
        EXPECT_TRUE(close_rel_l2(d_tw.download<float>(), wref, 1e-5)) << "weights";
        const auto off = d_off.download<int32_t>(), sorted = d_sorted.download<int32_t>(),
                   active = d_active.download<int32_t>();
        std::vector<int32_t> want_active;
        ASSERT_EQ(off[0], 0);
        for (int e = 0; e < E; ++e) {
          std::vector<int32_t> want;
          for (int i = 0; i < pairs; ++i)
            if (got_ids[i] == e) want.push_back(i);
          if (!want.empty()) want_active.push_back(e);
          const int len = off[e + 1] - off[e];
          ASSERT_EQ(len, (static_cast<int>(want.size()) + kMoeGemmTileM - 1) / kMoeGemmTileM * kMoeGemmTileM) << "expert " << e;
          std::vector<int32_t> got(sorted.begin() + off[e], sorted.begin() + off[e] + want.size());
          std::sort(got.begin(), got.end());
          ASSERT_EQ(got, want) << "expert " << e;
          for (int i = off[e] + static_cast<int>(want.size()); i < off[e + 1]; ++i) ASSERT_EQ(sorted[i], pairs);
        }
        ASSERT_EQ(active[0], static_cast<int32_t>(want_active.size()));
        ASSERT_EQ(std::vector<int32_t>(active.begin() + 1, active.begin() + 1 + want_active.size()), want_active);
      }
    }
  }
  EXPECT_EQ(d_counter.download<int32_t>()[0], 0) << "block counter left non-zero";
}

TEST_F(MoeTest, GroupedGemmQwen3Shapes) {
  SCOPED_TRACE(trace());
  gemm_case(*this, rng, stream, 1, 64, 8, 2048, 768, -1);
  gemm_case(*this, rng, stream, 12, 32, 8, 2048, 768, 7);
}

}  // namespace
}  // namespace moebatch::test
