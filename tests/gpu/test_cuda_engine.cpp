// The CUDA engine on one GPU: every fixture against its float64 oracle (bf16 tolerance, compared
// only up to the first router near-tie), GPU against the CPU engine on fresh random prompts,
// decode-with-cache against full recompute, batch invariance, graph replay against eager,
// device sampling, the memory plan's error and info(), and the q/k/v bias kernel (these skip
// without a GPU). On two GPUs (skipped with fewer, or without NCCL): tensor parallelism against
// one GPU on every fixture and a random-weight model in both MoE modes (intermediate split and
// expert parallel), greedy generation, graph replay with collectives, and the watchdog turning a
// stuck rank into an Error. The option checks, the weight-format dispatch, the rank threads and
// the watchdog's logic run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "engine/cuda/comm_watchdog.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/linear.h"
#include "engine/cuda/rank_threads.h"
#include "engine/engine.h"
#include "engine/model_files.h"
#include "kernels/gemm.cuh"
#include "kernels/gemm_fp8.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/moe_wgmma.cuh"
#include "tests/common/prompts.h"
#include "tests/engine/reference.h"
#include "tests/gpu/gpu_test_util.h"

namespace moebatch {
namespace {

// bf16 weights and activations: router logits move by ~1e-2, so positions after a closer
// router tie are not compared (tests/data/FIXTURES.md).
constexpr float kRouteGap = 5e-2f;
constexpr float kGreedyMargin = 1e-1f;
// Per-position ‖gpu − ref‖ / ‖ref‖ of the logits (bf16 storage: ~1e-2 expected).
constexpr double kRelTol = 3e-2;
// The same with the routed experts W8A8 (e4m3 activations per 1 × 128, each value within 2^-4
// relative of its input): measured on the tiny FP8 fixture (bench/RESULTS.md).
constexpr double kW8a8Tol = 8e-2;

const std::vector<std::string> kFixtures = {"qwen3_moe_tiny", "qwen2_moe_tiny", "qwen3_dense_tiny",
                                            "qwen3_next_tiny",
                                            "qwen3_moe_tiny_fp8", "qwen3_moe_tiny_nvfp4",
                                            "qwen3moe_tiny_q4km"};

// The oracle tolerance of a fixture. The tiny NVFP4 model measured 0.067 at one of 13
// comparable positions with its weights decoded to bf16 (its CPU decode matches the float64
// oracle within 3.3e-5, and the GPU matches the CPU engine within 3.5e-2 on random prompts), so
// its bound is 8e-2; its weights now stay packed (W4A16).
// The FP8 fixture's experts run W8A8 on steps of more than one token (activations rounded to
// e4m3), so wherever the two sides of a comparison may differ by that rounding — the oracle, the
// CPU engine, a one-token decode step (W8A16 GEMV) against a recompute — its bound is kW8a8Tol.
double w8a8_tol(const std::string& fixture) {
  return fixture == "qwen3_moe_tiny_fp8" ? kW8a8Tol : kRelTol;
}
double oracle_tol(const std::string& fixture) {
  return fixture == "qwen3_moe_tiny_nvfp4" ? 8e-2 : w8a8_tol(fixture);
}

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool have_gpu() { return gpu_count() > 0; }

// Tensor-parallel tests need two GPUs and a build with NCCL.
bool have_two_gpus() { return cuda_backend_has_nccl() && gpu_count() >= 2; }

// Small capacities on purpose: the 130-token prompt is cut into chunks and lm_head rows into
// several calls, exercising both paths.
CudaBackendOptions small_options(bool graphs = true) {
  CudaBackendOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.max_kv_cache_bytes = 64 << 20;
  o.cuda_graphs = graphs;
  return o;
}

// FP8 experts split along their 128-wide intermediate dim over two ranks cut every FP8 block in
// half, which the loader refuses (tests/engine/test_packed_weights.cpp); that combination runs
// decoded to bf16, the other modes keep the checkpoint's formats.
Quantization quantization_for(const std::string& model, int tp, ExpertSplit split) {
  return model == "qwen3_moe_tiny_fp8" && tp > 1 && split == ExpertSplit::Intermediate
             ? Quantization::None
             : Quantization::Auto;
}

// The same capacities through the factory, as the CLI and the service build engines.
std::unique_ptr<Engine> gpu_engine(const std::string& model, bool graphs = true, int tp = 1,
                                   ExpertSplit split = ExpertSplit::Intermediate,
                                   std::optional<Quantization> quant = std::nullopt) {
  const CudaBackendOptions o = small_options(graphs);
  EngineSpec spec = fixture_spec(
      model, tp,
      {.max_num_seqs = o.max_num_seqs, .max_num_batched_tokens = o.max_num_batched_tokens},
      split);
  spec.backend = "cuda";
  spec.kv_cache_bytes = o.max_kv_cache_bytes;
  spec.cuda_graphs = o.cuda_graphs;
  spec.quantization = quant.value_or(quantization_for(model, tp, split));
  return make_engine(spec).engine;
}

using test::random_prompt;

Request request(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens, bool keep) {
  return greedy_request(id, std::move(prompt), max_tokens, keep);
}

// Per-row relative errors of two [rows, V] logits blocks; NaN rows give +inf.
std::vector<double> row_errors(const std::vector<float>& got, const std::vector<float>& ref,
                               int64_t V) {
  std::vector<double> e;
  for (size_t r = 0; r * V < ref.size(); ++r)
    e.push_back(rel_err(got.data() + r * V, ref.data() + r * V, V));
  return e;
}

// Without router-gap data (random prompts, generated tokens), a MoE model may route a row
// differently from the reference; dense models have no routing and must match on every row.
void expect_rows_close(const std::vector<double>& errs, bool dense, const std::string& what,
                       double tol = kRelTol) {
  size_t close = 0;
  for (double e : errs) {
    ASSERT_FALSE(std::isnan(e) || std::isinf(e)) << what << ": non-finite logits";
    close += e < tol;
  }
  if (dense) {
    EXPECT_EQ(close, errs.size()) << what;
  } else {
    EXPECT_GE(close * 4, errs.size() * 3) << what << ": fewer than 3/4 of rows close";
  }
  const double worst = errs.empty() ? 0 : *std::max_element(errs.begin(), errs.end());
  std::printf("%s: %zu/%zu rows within %.0e, worst %.3g\n", what.c_str(), close, errs.size(),
              tol, worst);
}

// top-1 minus top-2 logit of a row: greedy choices closer than kGreedyMargin may flip.
double top2_margin(const float* row, int64_t V) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < V; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return static_cast<double>(a) - b;
}

// Greedy tokens of `got` equal those of `base` (which kept its logits) until base's first step
// whose top-2 margin is under kGreedyMargin (the same history up to there). Returns the steps
// compared.
size_t expect_greedy_equal(const FinishedSequence& base, const FinishedSequence& got, int64_t V,
                           const std::string& what) {
  size_t s = 0;
  for (; s < base.tokens.size() && s < got.tokens.size(); ++s) {
    if (top2_margin(base.logits.data() + s * V, V) <= kGreedyMargin) break;
    EXPECT_EQ(got.tokens[s], base.tokens[s]) << what << " step " << s;
    if (got.tokens[s] != base.tokens[s]) break;
  }
  return s;
}

class CudaFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaFixture, LogitsMatchReference) {
  auto ref = load_reference(GetParam());
  auto eng = gpu_engine(GetParam());
  const int64_t V = eng->config().vocab_size;
  double worst = 0;
  size_t compared = 0, total = 0;
  std::vector<double> all_rows;
  // qwen3_next_tiny stores no router gaps: with bf16 noise its 16-expert top-4 routing flips at
  // some positions (two GPU paths that differ only in GEMM summation order disagree there as
  // much), so its rows are judged by the 3-in-4 rule below alone.
  const bool dense = GetParam() == "qwen3_dense_tiny";
  for (const auto& r : ref) {
    auto logits = eng->score(r.prompt);
    ASSERT_EQ(logits.size(), r.prompt.size() * V);
    const size_t upto = r.route_known || dense ? comparable_prefix(r.route_gap, kRouteGap) : 0;
    total += r.prompt.size();
    for (size_t t = 0; t < upto; ++t) {
      const double e = rel_err(logits.data() + t * V, r.logits.data() + t * V, V);
      worst = std::max(worst, e);
      ++compared;
      EXPECT_LT(e, oracle_tol(GetParam())) << GetParam() << " prompt len " << r.prompt.size()
                                           << " pos " << t;
    }
    auto errs = row_errors(logits, r.logits, V);
    all_rows.insert(all_rows.end(), errs.begin(), errs.end());
  }
  // With bf16 router logits few positions lie before the first gap under 5e-2 (router ties
  // are dense in these tiny models), so every position is also checked: all of them for the
  // dense model, three in four for MoE models (a flipped expert moves a row's logits).
  if (ref.front().route_known || dense) {
    EXPECT_GT(compared, 0u) << "no comparable position";
  }
  expect_rows_close(all_rows, dense, GetParam() + " all positions", oracle_tol(GetParam()));
  std::printf("%s: %zu/%zu positions compared, worst relative error %.3g\n", GetParam().c_str(),
              compared, total, worst);
}

TEST_P(CudaFixture, GreedyMatchesReferenceUntilNearTie) {
  auto ref = load_reference(GetParam());
  auto eng = gpu_engine(GetParam());
  size_t checked = 0, eligible = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto& r = ref[i];
    if (comparable_prefix(r.route_gap, kRouteGap) < r.prompt.size()) continue;
    eligible += r.greedy_margin[0] > kGreedyMargin;
    eng->add(request(i, r.prompt, static_cast<int64_t>(r.greedy.size()), false));
    auto fin = run_to_completion(*eng);
    ASSERT_EQ(fin.size(), 1u);
    for (size_t s = 0; s < r.greedy.size() && r.greedy_margin[s] > kGreedyMargin; ++s) {
      ASSERT_EQ(fin[0].tokens[s], r.greedy[s]) << GetParam() << " prompt " << i << " step " << s;
      ++checked;
    }
  }
  std::printf("%s: %zu greedy steps checked\n", GetParam().c_str(), checked);
  // Every fp8 prompt has a router gap under 5e-2; the other fixtures must compare steps.
  if (eligible > 0) {
    EXPECT_GT(checked, 0u) << "no greedy step compared";
  }
}

// The bf16 GPU engine against the fp32 CPU engine on fresh random prompts (chunked prefill).
TEST_P(CudaFixture, MatchesCpuEngineOnRandomPrompts) {
  std::mt19937 rng(std::random_device{}());
  auto gpu = gpu_engine(GetParam());
  auto cpu = make_engine(GetParam());
  const int64_t V = gpu->config().vocab_size;
  // The 3-in-4 rule of MoE models is over all rows together: a one-token prompt is one row, and
  // one router near-tie there must not decide the test.
  std::vector<double> errs;
  for (size_t len : {size_t{1}, size_t{37}, size_t{150}}) {
    auto prompt = random_prompt(rng, len, V);
    const auto e = row_errors(gpu->score(prompt), cpu->score(prompt), V);
    errs.insert(errs.end(), e.begin(), e.end());
  }
  expect_rows_close(errs, GetParam() == "qwen3_dense_tiny", GetParam() + " lengths 1, 37, 150",
                    w8a8_tol(GetParam()));
}

// Prefill with every MoE layer on the many-token path (pairs gathered in sorted order, the
// experts' GEMMs on wgmma where the GPU has it and on cuBLAS, combine through the pair → row
// map) against the grouped decode GEMM on the same prompts: equal within bf16 tolerance (only
// the GEMMs' summation order and, on cuBLAS, a rounding before SiLU·mul differ). FP8 experts on
// wgmma also run W8A8 (activations quantized to e4m3 per 1 × 128): that variant against the
// float64 oracle as well, within kW8a8Tol.
TEST_P(CudaFixture, SortedExpertPathMatchesGroupedKernel) {
  std::mt19937 rng(std::random_device{}());
  EngineOptions eo{.max_num_seqs = 8, .max_num_batched_tokens = 64};
  const bool fp8 = GetParam() == "qwen3_moe_tiny_fp8";
  struct Variant {
    bool wgmma, w8a8;
  };
  for (Variant v : {Variant{true, false}, Variant{false, false}, Variant{true, true}}) {
    if (v.w8a8 && !fp8) continue;
    // the grouped GEMM with the same activations (W8A8 or bf16) as the sorted path
    // The W8A8 projections go with the W8A8 experts: e4m3 rounding of the activations turns the
    // bf16-level differences between the expert paths into steps of 2^-4, which kRelTol cannot hold.
    CudaBackendOptions grouped = small_options();
    grouped.moe_sorted_min_rows_per_expert = 0;
    grouped.w8a8_experts = v.w8a8;
    grouped.w8a8_linear = v.w8a8;
    Engine b(std::make_unique<CudaBackend>(fixture_path(GetParam()), grouped), eo);
    const int64_t V = b.config().vocab_size;
    CudaBackendOptions sorted = small_options();
    sorted.moe_sorted_min_rows_per_expert = 1;
    sorted.wgmma_experts = v.wgmma;
    sorted.w8a8_experts = v.w8a8;
    sorted.w8a8_linear = v.w8a8;
    Engine a(std::make_unique<CudaBackend>(fixture_path(GetParam()), sorted), eo);
    std::vector<double> errs;
    for (size_t len : {size_t{40}, size_t{150}}) {
      auto prompt = random_prompt(rng, len, V);
      const auto e = row_errors(a.score(prompt), b.score(prompt), V);
      errs.insert(errs.end(), e.begin(), e.end());
    }
    const std::string name = v.w8a8 ? "wgmma W8A8" : v.wgmma ? "wgmma" : "cuBLAS";
    expect_rows_close(errs, GetParam() == "qwen3_dense_tiny", GetParam() + " sorted (" + name + ") vs grouped",
                      v.w8a8 ? kW8a8Tol : kRelTol);
    if (v.w8a8) {
      // against the oracle at every position, by the same 3-in-4 rule (router near-ties)
      std::vector<double> all;
      for (const auto& r : load_reference(GetParam())) {
        const auto e = row_errors(a.score(r.prompt), r.logits, V);
        all.insert(all.end(), e.begin(), e.end());
      }
      expect_rows_close(all, false, GetParam() + " sorted (W8A8) vs oracle, all positions", kW8a8Tol);
    }
  }
}

// FP8-block projections of steps with more than 8 rows run W8A8 on cuBLASLt's block-scaled GEMM
// where the GPU is a Hopper (CudaBackendOptions::w8a8_linear): against the same model with them
// decoded to bf16, on prompts whose lengths leave a GEMV tail of 1 and 2 rows (37, 150); and not
// bit-equal, which says the path ran. Bound 1.5 × kW8a8Tol: both sides are W8A8-level
// approximations of the model (the experts run W8A8 on both), so their distance is up to the sum
// of their errors (measured: 145–163 of 187 rows within kW8a8Tol, worst 0.12–0.20).
TEST_P(CudaFixture, W8a8ProjectionsMatchDecodedWeights) {
  if (GetParam() != "qwen3_moe_tiny_fp8") GTEST_SKIP() << "FP8-block checkpoints only";
  if (!kernels::fp8_block_gemm_available(0)) GTEST_SKIP() << "block-scaled FP8 GEMM needs a Hopper GPU";
  std::mt19937 rng(std::random_device{}());
  EngineOptions eo{.max_num_seqs = 8, .max_num_batched_tokens = 256};
  CudaBackendOptions decoded = small_options();
  decoded.max_num_batched_tokens = 256;
  decoded.w8a8_linear = false;
  CudaBackendOptions w8a8 = decoded;
  w8a8.w8a8_linear = true;
  Engine a(std::make_unique<CudaBackend>(fixture_path(GetParam()), w8a8), eo);
  Engine b(std::make_unique<CudaBackend>(fixture_path(GetParam()), decoded), eo);
  const int64_t V = a.config().vocab_size;
  std::vector<double> errs;
  for (size_t len : {size_t{37}, size_t{150}}) {
    auto prompt = random_prompt(rng, len, V);
    const auto e = row_errors(a.score(prompt), b.score(prompt), V);
    errs.insert(errs.end(), e.begin(), e.end());
  }
  expect_rows_close(errs, false, GetParam() + " W8A8 projections vs decoded", 1.5 * kW8a8Tol);
  EXPECT_GT(*std::max_element(errs.begin(), errs.end()), 0.0) << "W8A8 projections did not run";
}

StepBatch one_token_batch();

// Whether one eager one-token step of `fixture` under `o` records stage `name` (StageTimer marks).
bool step_has_stage(const std::string& fixture, const CudaBackendOptions& o, const char* name) {
  CudaBackend be(fixture_path(fixture), o);
  const auto stages = be.profile(one_token_batch());
  return std::any_of(stages.begin(), stages.end(), [&](const auto& st) { return st.first == name; });
}

// One-token decode steps with a fused form of some stages (`fused`) against the same model with
// their separate launches (`base`, the fused options less the fusion): the decode logits of two
// sequences run one after the other (batch 1). `bitwise`: equal to the last bit (the fused
// kernel computes in the launches' order); otherwise within bf16 tolerance by the 3-in-4 rule (a
// sum taken in another order, and a router near-tie then flips a token).
void expect_decode_matches(const std::string& fixture, const CudaBackendOptions& fused,
                           const CudaBackendOptions& base, const std::string& what, bool bitwise) {
  std::mt19937 rng(std::random_device{}());
  EngineOptions eo{.max_num_seqs = 8, .max_num_batched_tokens = 64};
  Engine a(std::make_unique<CudaBackend>(fixture_path(fixture), fused), eo);
  Engine b(std::make_unique<CudaBackend>(fixture_path(fixture), base), eo);
  const int64_t V = a.config().vocab_size;
  std::vector<double> errs;
  for (uint64_t id : {1, 2}) {
    const auto prompt = random_prompt(rng, 20, V);
    a.add(request(id, prompt, 10, true));
    b.add(request(id, prompt, 10, true));
    const auto fa = run_to_completion(a), fb = run_to_completion(b);
    ASSERT_EQ(fa.size(), 1u);
    ASSERT_EQ(fb.size(), 1u);
    if (bitwise) {
      EXPECT_EQ(fa[0].tokens, fb[0].tokens) << fixture << " " << what;
      EXPECT_TRUE(fa[0].logits == fb[0].logits) << fixture << " " << what << ": logits differ";
    }
    const size_t rows = std::min(fa[0].logits.size(), fb[0].logits.size());
    const std::vector<float> la(fa[0].logits.begin(), fa[0].logits.begin() + rows),
        lb(fb[0].logits.begin(), fb[0].logits.begin() + rows);
    const auto e = row_errors(la, lb, V);
    errs.insert(errs.end(), e.begin(), e.end());
  }
  expect_rows_close(errs, fixture == "qwen3_dense_tiny", fixture + " " + what, w8a8_tol(fixture));
}

// The pending combine + add + norm formed inside the qkv GEMV (combine_norm_in_qkv), against its
// one-block launch; both without combine_in_down, which would leave the qkv GEMV no combine to form.
TEST_P(CudaFixture, CombineNormInQkvMatchesSeparateLaunch) {
  if (!kernels::gemv_stream_available(0)) GTEST_SKIP() << "gemv_stream needs a Hopper GPU and sm_90a code";
  CudaBackendOptions base = small_options();
  base.combine_in_down = false;
  CudaBackendOptions fused = base;
  fused.combine_norm_in_qkv = true;
  expect_decode_matches(GetParam(), fused, base, "combine + norm in qkv vs launch", false);
}

// The combine + add inside the down GEMV and the norm in the next qkv GEMV (combine_in_down):
// bitwise the separate launches on the same CUDA-core walk (4-bit experts would otherwise take
// the tensor-core walk in moe_gemv, whose sums round differently). It applies where the qkv GEMV
// is gemv_stream (bf16 on a Hopper GPU) after a routed-only MoE layer: the bf16 MoE fixtures on
// Hopper must take it; dense and shared-expert models defer no combine, quantized projections
// leave the norm a launch of its own.
TEST_P(CudaFixture, CombineInDownMatchesSeparateLaunch) {
  CudaBackendOptions base = small_options();
  base.mma_expert_gemv = false;
  base.combine_in_down = false;
  CudaBackendOptions fused = base;
  fused.combine_in_down = true;
  const bool folds = step_has_stage(GetParam(), fused, "moe_gemv_down_combine");
  if (kernels::gemv_stream_available(0) && GetParam() == "qwen3_moe_tiny") {
    ASSERT_TRUE(folds) << "the down GEMV took no combine";
  }
  if (!folds) GTEST_SKIP() << "no one-token MoE layer here whose next qkv GEMV forms the norm";
  expect_decode_matches(GetParam(), fused, base, "combine in down vs launch", true);
}

// A default-on option whose form computes the same arithmetic in the same order as without it:
// decode outputs equal to the bit with the option on (the default) and off.
void expect_default_on_bitwise(const std::string& fixture, bool CudaBackendOptions::*option,
                               const std::string& what) {
  const CudaBackendOptions on = small_options();
  ASSERT_TRUE(on.*option) << what << ": on by default";
  CudaBackendOptions off = on;
  off.*option = false;
  expect_decode_matches(fixture, on, off, what, true);
}

// The split decode kernel's partials merged across a thread block cluster against the workspace
// merge (which launches took clusters: the attn_decode cluster_merge op cases).
TEST_P(CudaFixture, ClusterAttentionMergeMatchesWorkspaceMerge) {
  expect_default_on_bitwise(GetParam(), &CudaBackendOptions::cluster_attention_merge,
                            "attention splits merged in a cluster vs workspace");
}

// The decode router as one cluster against its ticket form (which launches took the cluster:
// the moe_route_small cluster op cases).
TEST_P(CudaFixture, ClusterRouterMatchesTicketRouter) {
  expect_default_on_bitwise(GetParam(), &CudaBackendOptions::cluster_router, "router in a cluster vs tickets");
}

// The next kernel launched at the start of the projections, rope, attention and router against
// after their wait: only when blocks become resident changes.
TEST_P(CudaFixture, EarlyTriggerMatchesTriggerAfterWait) {
  expect_default_on_bitwise(GetParam(), &CudaBackendOptions::pdl_trigger_early, "early trigger vs after the wait");
}

// Logits of each decode step (paged cache, decode kernel, graphs) against a full recompute of
// the same tokens with the prefill path.
TEST_P(CudaFixture, DecodeWithCacheMatchesRecompute) {
  std::mt19937 rng(std::random_device{}());
  auto eng = gpu_engine(GetParam());
  const int64_t V = eng->config().vocab_size;
  auto prompt = random_prompt(rng, 20, V);
  eng->add(request(1, prompt, 12, true));
  auto fin = run_to_completion(*eng);
  ASSERT_EQ(fin.size(), 1u);
  auto all = prompt;
  all.insert(all.end(), fin[0].tokens.begin(), fin[0].tokens.end() - 1);
  auto full = eng->score(all);
  // Step s sampled from the logits of position prompt.size() - 1 + s.
  std::vector<float> recompute(full.begin() + (prompt.size() - 1) * V, full.end());
  expect_rows_close(row_errors(fin[0].logits, recompute, V), GetParam() == "qwen3_dense_tiny",
                    GetParam() + " decode vs recompute", w8a8_tol(GetParam()));
}

// A sequence's logits alone and inside a batch of others (different padding bucket, split
// count and GEMM shapes): equal within bf16 tolerance. The tiny MoE fixtures have router gaps
// below the rounding difference between a one-token GEMV and a batched GEMM, so one flipped
// expert in a trial changes that row and, through its cache entries, the rows after it; three
// trials on fresh prompts, of which two must keep 3/4 of their rows close (a batch-dependent
// bug fails every trial; a near-tie rarely hits two).
TEST_P(CudaFixture, BatchInvariance) {
  std::mt19937 rng(std::random_device{}());
  auto eng = gpu_engine(GetParam());
  const int64_t V = eng->config().vocab_size;
  const bool dense = GetParam() == "qwen3_dense_tiny";
  const double tol = w8a8_tol(GetParam());
  int good_trials = 0;
  for (int trial = 0; trial < 3; ++trial) {
    auto prompt = random_prompt(rng, 17, V);
    eng->add(request(0, prompt, 6, true));
    auto alone = run_to_completion(*eng);
    eng->add(request(0, prompt, 6, true));
    for (uint64_t id = 1; id <= 5; ++id)
      eng->add(request(id, random_prompt(rng, 3 + rng() % 40, V), 4 + rng() % 6, true));
    auto batched = run_to_completion(*eng);
    auto it = std::find_if(batched.begin(), batched.end(), [](auto& f) { return f.id == 0; });
    ASSERT_NE(it, batched.end());
    ASSERT_EQ(alone.size(), 1u);
    // Compare the rows both runs share (the tokens fed back may differ after a near-tie).
    size_t same = 0;
    while (same < it->tokens.size() && it->tokens[same] == alone[0].tokens[same]) ++same;
    const size_t rows = std::min(same + 1, it->tokens.size());
    std::vector<float> a(alone[0].logits.begin(), alone[0].logits.begin() + rows * V);
    std::vector<float> b(it->logits.begin(), it->logits.begin() + rows * V);
    const std::vector<double> errs = row_errors(b, a, V);
    size_t close = 0;
    for (double e : errs) {
      ASSERT_FALSE(std::isnan(e) || std::isinf(e)) << GetParam() << ": non-finite logits";
      close += e < tol;
    }
    if (dense) {
      EXPECT_EQ(close, errs.size()) << GetParam() << " batched vs alone, trial " << trial;
    }
    good_trials += close * 4 >= errs.size() * 3;
    std::printf("%s batched vs alone, trial %d: %zu/%zu rows within %.0e, worst %.3g\n",
                GetParam().c_str(), trial, close, errs.size(), tol,
                *std::max_element(errs.begin(), errs.end()));
  }
  EXPECT_GE(good_trials, 2) << GetParam() << ": batched vs alone differ in more than one trial";
}

// The same requests with decode graphs replayed and with the same launches run eagerly:
// bitwise equal logits and tokens (with tp > 1 the graphs hold the collectives; a sum of two
// ranks is one rounding in either order, so NCCL's choice of algorithm does not matter).
// `seqs` sequences decode together (more than 8: the decode steps' projections leave the GEMV).
void expect_graph_replay_equals_eager(const std::string& model, int tp, ExpertSplit split, int seqs = 3) {
  std::mt19937 rng(std::random_device{}());
  CudaBackendOptions og = small_options(true), oe = small_options(false);
  og.max_num_seqs = oe.max_num_seqs = std::max<int64_t>(og.max_num_seqs, seqs);
  og.tensor_parallel_size = oe.tensor_parallel_size = tp;
  og.expert_split = oe.expert_split = split;
  og.quantization = oe.quantization = quantization_for(model, tp, split);
  auto graphs = std::make_unique<CudaBackend>(fixture_path(model), og);
  auto eager = std::make_unique<CudaBackend>(fixture_path(model), oe);
  CudaBackend* g = graphs.get();
  CudaBackend* e = eager.get();
  EngineOptions eo;
  eo.max_num_seqs = og.max_num_seqs;
  eo.max_num_batched_tokens = 64;
  Engine eg(std::move(graphs), eo), ee(std::move(eager), eo);
  const int64_t V = eg.config().vocab_size;
  for (uint64_t id = 0; id < static_cast<uint64_t>(seqs); ++id) {
    auto p = random_prompt(rng, 5 + rng() % 30, V);
    eg.add(request(id, p, 10, true));
    ee.add(request(id, p, 10, true));
  }
  auto fg = run_to_completion(eg), fe = run_to_completion(ee);
  ASSERT_EQ(fg.size(), fe.size());
  EXPECT_GT(g->num_graphs(), 0u);
  EXPECT_EQ(e->num_graphs(), 0u);
  for (size_t i = 0; i < fg.size(); ++i) {
    EXPECT_EQ(fg[i].tokens, fe[i].tokens);
    ASSERT_EQ(fg[i].logits.size(), fe[i].logits.size());
    for (float x : fg[i].logits) ASSERT_TRUE(std::isfinite(x));
    EXPECT_TRUE(fg[i].logits == fe[i].logits) << "graph replay differs from eager, tp " << tp;
  }
}

TEST_P(CudaFixture, GraphReplayEqualsEager) {
  expect_graph_replay_equals_eager(GetParam(), 1, ExpertSplit::Intermediate);
  // FP8 blocks: decode steps of 12 rows run the projections W8A8 (cuBLASLt inside the graphs)
  if (GetParam() == "qwen3_moe_tiny_fp8") expect_graph_replay_equals_eager(GetParam(), 1, ExpertSplit::Intermediate, 12);
}

// Tokens sampled on the device (greedy) equal the host argmax of the same logits; seeded
// top-k/top-p sampling repeats with the same seed.
TEST_P(CudaFixture, DeviceSamplingMatchesHost) {
  std::mt19937 rng(std::random_device{}());
  auto a = gpu_engine(GetParam()), b = gpu_engine(GetParam());
  const int64_t V = a->config().vocab_size;
  auto p = random_prompt(rng, 9, V);
  a->add(request(0, p, 8, true));   // keeps logits: host sampling
  b->add(request(0, p, 8, false));  // device sampling
  auto fa = run_to_completion(*a), fb = run_to_completion(*b);
  EXPECT_EQ(fa[0].tokens, fb[0].tokens);
  std::vector<int32_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    Request r = request(1, p, 8, false);
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = 50;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = 1234;
    b->add(r);
    auto f = run_to_completion(*b);
    ASSERT_EQ(f.size(), 1u);
    for (int32_t t : f[0].tokens) EXPECT_TRUE(t >= 0 && t < V);
    if (rep == 0)
      first = f[0].tokens;
    else
      EXPECT_EQ(f[0].tokens, first) << "same seed, different tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaFixture, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return info.param; });

// bf16 checkpoints quantized on load (--quantization fp8 / nvfp4) against the oracle of the
// unquantized model. The weights themselves change (FP8 keeps 4 significant bits, NVFP4 2), so
// the bound is the quantization's, not bf16's: measured errors are printed; 0.15 (fp8) and 0.5
// (nvfp4) of relative L2 separate a working path from a broken one (wrong scales or layout give
// ~1 or more). The kernels' exactness is checked in tests/gpu/ops.
class CudaQuantizeOnLoad
    : public ::testing::TestWithParam<std::tuple<std::string, Quantization>> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaQuantizeOnLoad, LogitsNearTheUnquantizedOracle) {
  const auto& [model, q] = GetParam();
  const double bound = q == Quantization::Fp8 ? 0.15 : 0.5;  // int4 (16 levels per 32): as nvfp4
  auto ref = load_reference(model);
  auto eng = gpu_engine(model, true, 1, ExpertSplit::Intermediate, q);
  const int64_t V = eng->config().vocab_size;
  double worst = 0, sum = 0;
  size_t compared = 0;
  for (const auto& r : ref) {
    auto logits = eng->score(r.prompt);
    const size_t upto = comparable_prefix(r.route_gap, kRouteGap);
    for (size_t t = 0; t < upto; ++t) {
      const double e = rel_err(logits.data() + t * V, r.logits.data() + t * V, V);
      ASSERT_TRUE(std::isfinite(e)) << model;
      worst = std::max(worst, e);
      sum += e;
      ++compared;
    }
  }
  ASSERT_GT(compared, 0u);
  std::printf("%s quantized to %s on load: %zu positions, mean relative error %.3g, worst %.3g\n",
              model.c_str(), quantization_name(q), compared, sum / compared, worst);
  EXPECT_LT(worst, bound) << model << " " << quantization_name(q);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaQuantizeOnLoad,
                         ::testing::Combine(::testing::Values("qwen3_moe_tiny", "qwen3_dense_tiny"),
                                            ::testing::Values(Quantization::Fp8,
                                                              Quantization::Nvfp4,
                                                              Quantization::Int4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  quantization_name(std::get<1>(info.param));
                         });

TEST(CudaBackendMemory, OutOfMemoryAtStartNamesTheNumbers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CudaBackendOptions o = small_options();
  o.gpu_memory_utilization = 1e-4;
  try {
    CudaBackend be(test_data_dir() + "/qwen3_moe_tiny", o);
    FAIL() << "expected an out-of-memory error";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of GPU memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
  }
}

// info(): one device, its memory as planned, KV bytes per token from the model's shape.
TEST(CudaBackendInfo, ReportsPerDeviceNumbers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  CudaBackend be(test_data_dir() + "/qwen3_moe_tiny", small_options());
  const ModelConfig& mc = be.config();
  const BackendInfo& info = be.info();
  EXPECT_NE(info.description.find("cuda tp=1 on cuda:0"), std::string::npos) << info.description;
  EXPECT_NE(info.description.find("bf16"), std::string::npos) << info.description;
  EXPECT_EQ(info.block_size, 16);
  EXPECT_GT(info.kv_blocks, 0);
  EXPECT_EQ(info.kv_blocks, be.memory_plan().kv_blocks);
  EXPECT_EQ(info.kv_bytes_per_token, mc.num_kv_layers() * 2 * mc.num_kv_heads * mc.head_dim * 2);
  EXPECT_EQ(info.state_slots, 0);
  EXPECT_EQ(info.max_model_len, mc.max_position_embeddings);
  ASSERT_EQ(info.devices.size(), 1u);
  const DeviceUsage& d = info.devices[0];
  EXPECT_EQ(d.device, "cuda:0");
  EXPECT_EQ(d.weight_bytes, static_cast<int64_t>(be.memory_plan().weights));
  EXPECT_EQ(info.weight_bytes(), d.weight_bytes);
  EXPECT_GT(d.weight_bytes, 0);
  // the pool holds the engine's blocks plus the scratch block of padded decode rows
  EXPECT_EQ(d.kv_bytes, (info.kv_blocks + 1) * info.block_size * info.kv_bytes_per_token);
  EXPECT_LE(d.kv_bytes, 64 << 20);  // small_options caps the pool
  EXPECT_EQ(d.state_bytes, 0);
  EXPECT_GT(d.activation_bytes, 0);
  EXPECT_GE(d.total_bytes, d.weight_bytes + d.kv_bytes + d.activation_bytes);
}

// Bad tensor-parallel options are refused before any device is touched (runs without a GPU):
// more than one rank in a build without NCCL, a communicator joining another number of ranks, a
// device listed twice, a non-positive collective timeout, a stall hook without the backend's own
// communicator or out of range.
TEST(CudaBackendOptionsCheck, TensorParallelOptions) {
  const std::string dir = test_data_dir() + "/qwen3_moe_tiny";
  CudaBackendOptions o = small_options();
  o.tensor_parallel_size = 2;
  if (!cuda_backend_has_nccl()) {
    try {
      CudaBackend be(dir, o);
      FAIL() << "expected an InputError";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("needs NCCL"), std::string::npos) << e.what();
    }
  }
  struct TwoRanks final : Communicator {
    int world() const override { return 2; }
    void all_reduce_sum(int, void*, size_t, CommDType, CommStream) override {}
    void all_gather(int, const void*, void*, size_t, CommDType, CommStream) override {}
  } comm;
  CudaBackendOptions c = o;
  c.comm = &comm;
  c.devices = {0, 1, 2};
  try {
    CudaBackend be(dir, c);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("joins 2 ranks"), std::string::npos) << e.what();
  }
  c.devices = {0, 0};
  EXPECT_THROW(CudaBackend(dir, c), InputError);
  c.devices.clear();
  c.debug_stall_rank = 0;  // a caller's communicator: no watchdog to release the stall
  EXPECT_THROW(CudaBackend(dir, c), InputError);
  CudaBackendOptions t = o;
  t.collective_timeout_s = 0;
  EXPECT_THROW(CudaBackend(dir, t), InputError);
  t = o;
  t.debug_stall_rank = 2;
  EXPECT_THROW(CudaBackend(dir, t), InputError);
  t.tensor_parallel_size = 1;
  t.debug_stall_rank = 0;
  EXPECT_THROW(CudaBackend(dir, t), InputError);
}

// A stand-in communicator for the watchdog's logic: records the abort, reports an asynchronous
// error on demand.
class FakeAbortableComm final : public AbortableComm {
 public:
  std::string async_error() override {
    std::lock_guard lk(mu_);
    return error_;
  }
  void abort(const std::string& reason) override {
    std::lock_guard lk(mu_);
    reason_ = reason;
    aborted_ = true;
  }
  bool aborted() const override { return aborted_.load(); }
  std::string abort_reason() const override {
    std::lock_guard lk(mu_);
    return reason_;
  }
  void set_error(std::string e) {
    std::lock_guard lk(mu_);
    error_ = std::move(e);
  }
  // Waits up to `seconds` for the abort.
  bool wait_aborted(double seconds) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!aborted() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return aborted();
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> aborted_{false};
  std::string error_, reason_;
};

// A step longer than the timeout aborts the communicator, naming the rank that made the least
// progress; end_step() reports the failure.
TEST(CommWatchdogTest, TimeoutAbortsAndNamesTheStuckRank) {
  FakeAbortableComm comm;
  CommWatchdog wd(comm, 3, 0.2);
  wd.begin_step();
  wd.progress(0);
  wd.progress(2);
  ASSERT_TRUE(comm.wait_aborted(10));
  const std::string failure = wd.end_step();
  EXPECT_NE(failure.find("collective timeout after 0.2 s on rank 1"), std::string::npos)
      << failure;
  EXPECT_EQ(comm.abort_reason(), failure);
  EXPECT_EQ(wd.abort_reason(), failure);
  EXPECT_TRUE(wd.fired());
}

// Steps shorter than the timeout and idle time between them never fire, however long the idle
// time; an asynchronous error outside a step is not polled.
TEST(CommWatchdogTest, ShortStepsAndIdleTimeNeverFire) {
  FakeAbortableComm comm;
  CommWatchdog wd(comm, 2, 0.15);
  for (int i = 0; i < 10; ++i) {
    wd.begin_step();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(wd.end_step(), "");
  }
  comm.set_error("NCCL error on rank 1: remote process exited or there was a network error");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(comm.aborted());
  EXPECT_FALSE(wd.fired());
}

// An asynchronous error during a step aborts at once (well before the timeout).
TEST(CommWatchdogTest, AsyncErrorAborts) {
  FakeAbortableComm comm;
  CommWatchdog wd(comm, 2, 100.0);
  comm.set_error("NCCL error on rank 1: unhandled cuda error");
  wd.begin_step();
  ASSERT_TRUE(comm.wait_aborted(10));
  const std::string failure = wd.end_step();
  EXPECT_NE(failure.find("NCCL error on rank 1"), std::string::npos) << failure;
}

// A rank that fails mid-step trips the watchdog: the communicator is aborted with the rank's
// message at once, and end_step() leaves the rank's own exception to report it.
TEST(CommWatchdogTest, TripAbortsWithTheRanksMessage) {
  FakeAbortableComm comm;
  CommWatchdog wd(comm, 2, 100.0);
  wd.begin_step();
  wd.trip(1, "moe_gemm: bad expert count");
  ASSERT_TRUE(comm.wait_aborted(10));
  EXPECT_NE(comm.abort_reason().find("rank 1 failed mid-step: moe_gemm: bad expert count"),
            std::string::npos)
      << comm.abort_reason();
  EXPECT_EQ(wd.end_step(), "");
  EXPECT_TRUE(wd.fired());
  EXPECT_EQ(wd.abort_reason(), comm.abort_reason());
}

// A weight format without a kernel fails loudly in the GEMM dispatch, naming the format (no
// device work happens before the check).
TEST(CudaWeightFormats, UnsupportedFormatNamesIt) {
  DeviceTensor w;
  w.format = WeightFormat::F32;
  w.shape = {16, 32};
  try {
    linear(GemmContext{}, static_cast<bf16*>(nullptr), nullptr, w, 1);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.as_bf16(), Error);
  w.shape = {4, 32, 32};
  kernels::MoeGemmParams p;
  p.num_experts = 4;
  p.n = 32;
  p.k = 32;
  EXPECT_THROW(expert_gemm(GemmContext{}, p, w, 1), Error);
  EXPECT_EQ(w.bytes(), 4u * 32 * 32 * 4);
}

// Rank threads: every rank runs once per run_all on its own thread (the caller's with one),
// the first exception comes back after all ranks ran, and start/stop cycles are clean.
TEST(RankThreadsTest, RunsEveryRankAndRethrows) {
  for (int cycle = 0; cycle < 20; ++cycle) {
    for (int n : {1, 2, 4}) {
      RankThreads threads(n);
      ASSERT_EQ(threads.size(), n);
      for (int step = 0; step < 5; ++step) {
        std::vector<int> hits(n, 0);
        std::vector<std::thread::id> ids(n);
        threads.run_all([&](int r) {
          ++hits[r];
          ids[r] = std::this_thread::get_id();
        });
        for (int r = 0; r < n; ++r) EXPECT_EQ(hits[r], 1);
        if (n == 1) {
          EXPECT_EQ(ids[0], std::this_thread::get_id());
        }
        for (int r = 1; r < n; ++r) EXPECT_NE(ids[r], ids[0]);
      }
      std::atomic<int> ran{0};
      EXPECT_THROW(threads.run_all([&](int r) {
        ++ran;
        if (r == n - 1) throw std::runtime_error("rank failed");
      }),
                   std::runtime_error);
      EXPECT_EQ(ran.load(), n);
      threads.run_all([&](int) { ++ran; });  // still usable after a failure
      EXPECT_EQ(ran.load(), 2 * n);
    }
  }
}

// --- tensor parallelism on two GPUs ----------------------------------------------------------

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* split_name(ExpertSplit s) { return s == ExpertSplit::Expert ? "ep" : "tp"; }

// One token at position 0 in KV block 0 and state slot 0, its logits wanted.
StepBatch one_token_batch() {
  StepBatch b;
  b.tokens = {1};
  b.positions = {0};
  b.seq_index = {0};
  b.slot_mapping = {0};
  b.block_tables = {0};
  b.max_blocks_per_seq = 1;
  b.state_slots = {0};
  b.logits_rows = {0};
  return b;
}

// A fixture on two GPUs, in one MoE mode, against the same fixture on one GPU.
class CudaTensorParallel : public ::testing::TestWithParam<std::tuple<std::string, ExpertSplit>> {
 protected:
  void SetUp() override {
    if (!have_two_gpus()) GTEST_SKIP() << "needs 2 GPUs and a build with NCCL";
    if (dense() && split() == ExpertSplit::Expert) {
      std::printf("%s: dense model, no experts to split (expert parallel = tensor parallel)\n",
                  model().c_str());
      GTEST_SKIP() << "dense model: no experts to split";
    }
  }
  const std::string& model() const { return std::get<0>(GetParam()); }
  ExpertSplit split() const { return std::get<1>(GetParam()); }
  bool dense() const { return model() == "qwen3_dense_tiny"; }
  std::string label() const { return model() + " " + split_name(split()) + "2"; }
};

// Every reference prompt scored on two GPUs against one GPU (and the oracle): positions before
// the first router near-tie within kRelTol (the FP8 fixture: kW8a8Tol — a shard whose fused
// 128-row block mixes k and v rows, or a run decoded to bf16, takes its projections or experts
// off the W8A8 path that one GPU runs), and over all positions every row (dense) or 3 in 4 rows
// (MoE). The two differ by where bf16 rounds: each rank's partial o_proj / MLP output is
// rounded before the all-reduce.
TEST_P(CudaTensorParallel, LogitsMatchSingleRank) {
  auto ref = load_reference(model());
  auto one = gpu_engine(model()), two = gpu_engine(model(), true, 2, split());
  const int64_t V = one->config().vocab_size;
  std::vector<double> vs_one, vs_oracle;
  size_t compared = 0;
  double worst = 0;
  for (const auto& r : ref) {
    const auto a = one->score(r.prompt), b = two->score(r.prompt);
    ASSERT_EQ(b.size(), a.size());
    const size_t upto = comparable_prefix(r.route_gap, kRouteGap);
    for (size_t t = 0; t < upto; ++t) {
      const double e = rel_err(b.data() + t * V, a.data() + t * V, V);
      worst = std::max(worst, e);
      ++compared;
      EXPECT_LT(e, w8a8_tol(model())) << label() << " prompt len " << r.prompt.size() << " pos " << t;
    }
    auto e1 = row_errors(b, a, V), e2 = row_errors(b, r.logits, V);
    vs_one.insert(vs_one.end(), e1.begin(), e1.end());
    vs_oracle.insert(vs_oracle.end(), e2.begin(), e2.end());
  }
  expect_rows_close(vs_one, dense(), label() + " vs tp1, all positions", w8a8_tol(model()));
  expect_rows_close(vs_oracle, dense(), label() + " vs oracle, all positions", oracle_tol(model()));
  std::printf("%s: %zu positions before a router near-tie, worst vs tp1 %.3g\n", label().c_str(),
              compared, worst);
}

// Greedy generation on two GPUs (sampled on rank 0's device) equals one GPU's until one GPU's
// first top-2 margin under kGreedyMargin, on the prompts without a router near-tie.
TEST_P(CudaTensorParallel, GreedyMatchesSingleRankUntilNearTie) {
  auto ref = load_reference(model());
  auto one = gpu_engine(model()), two = gpu_engine(model(), true, 2, split());
  const int64_t V = one->config().vocab_size;
  size_t checked = 0, eligible = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto& r = ref[i];
    if (comparable_prefix(r.route_gap, kRouteGap) < r.prompt.size()) continue;
    ++eligible;
    const auto n = static_cast<int64_t>(r.greedy.size());
    one->add(request(i, r.prompt, n, true));
    two->add(request(i, r.prompt, n, false));
    auto f1 = run_to_completion(*one), f2 = run_to_completion(*two);
    ASSERT_EQ(f1.size(), 1u);
    ASSERT_EQ(f2.size(), 1u);
    checked += expect_greedy_equal(f1[0], f2[0], V, label() + " prompt " + std::to_string(i));
  }
  std::printf("%s: %zu greedy steps checked over %zu prompts\n", label().c_str(), checked,
              eligible);
}

// Decode graphs that hold the all-reduces and the lm_head all-gather replay bitwise like the
// same launches run eagerly.
TEST_P(CudaTensorParallel, GraphReplayEqualsEager) {
  expect_graph_replay_equals_eager(model(), 2, split());
}

// The all-reduce paths agree bit for bit: NCCL for every message, the peer-to-peer all-reduce
// fused with the add + RMSNorm for every message, and the mix the service runs (here: decode
// steps of up to 4 rows peer-to-peer, prefill chunks through NCCL). A sum of two ranks is one
// rounding of the fp32 sum in either, so logits and tokens must be equal, with decode graphs.
// The stage names of a profiled one-token step show which path ran.
TEST_P(CudaTensorParallel, CustomAllReduceEqualsNccl) {
  std::mt19937 rng(std::random_device{}());
  const auto cfg = load_any_model_config(fixture_path(model()));
  const size_t row_bytes = static_cast<size_t>(cfg.hidden_size) * sizeof(bf16);
  EngineOptions eo;
  eo.max_num_seqs = 8;
  eo.max_num_batched_tokens = 64;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(random_prompt(rng, 5 + rng() % 50, cfg.vocab_size));
  struct Run {
    const char* name;
    size_t max_bytes;
    const char* stage;  // the all-reduce stage of a one-token step
  };
  const Run runs[] = {{"nccl", 0, "all_reduce"},
                      {"p2p", kCustomAllReduceMaxBytes, "all_reduce_add_norm"},
                      {"mixed", 4 * row_bytes, "all_reduce_add_norm"}};
  std::vector<std::vector<FinishedSequence>> results;
  for (const Run& run : runs) {
    SCOPED_TRACE(run.name);
    CudaBackendOptions o = small_options(true);
    o.tensor_parallel_size = 2;
    o.expert_split = split();
    o.quantization = quantization_for(model(), 2, split());
    o.custom_all_reduce_max_bytes = run.max_bytes;
    auto backend = std::make_unique<CudaBackend>(fixture_path(model()), o);
    const auto stages = backend->profile(one_token_batch());
    const auto has = [&](const char* name) {
      return std::any_of(stages.begin(), stages.end(), [&](const auto& st) { return st.first == name; });
    };
    EXPECT_TRUE(has(run.stage)) << label() << ": no stage " << run.stage;
    EXPECT_FALSE(has(run.max_bytes ? "all_reduce" : "all_reduce_add_norm")) << label();
    Engine eng(std::move(backend), eo);
    for (size_t i = 0; i < prompts.size(); ++i) eng.add(request(i, prompts[i], 8, true));
    auto fin = run_to_completion(eng);
    std::sort(fin.begin(), fin.end(), [](const auto& a, const auto& c) { return a.id < c.id; });
    results.push_back(std::move(fin));
  }
  for (size_t k = 1; k < results.size(); ++k) {
    ASSERT_EQ(results[k].size(), results[0].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_EQ(results[k][i].tokens, results[0][i].tokens) << label() << " " << runs[k].name;
      EXPECT_TRUE(results[k][i].logits == results[0][i].logits)
          << label() << ": " << runs[k].name << " logits differ from nccl's, request " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTensorParallel,
                         ::testing::Combine(::testing::ValuesIn(kFixtures),
                                            ::testing::Values(ExpertSplit::Intermediate,
                                                              ExpertSplit::Expert)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  split_name(std::get<1>(info.param));
                         });

// info() of a two-GPU backend: one DeviceUsage per GPU, each holding half the experts (expert
// parallel) and half the kv heads, the KV bytes per token summed over both as on one GPU.
TEST(CudaTensorParallelInfo, ReportsEveryDevice) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 GPUs and a build with NCCL";
  const std::string dir = test_data_dir() + "/qwen3_moe_tiny";
  CudaBackendOptions o = small_options();
  const CudaBackend one(dir, o);
  o.tensor_parallel_size = 2;
  o.expert_split = ExpertSplit::Expert;
  const CudaBackend two(dir, o);
  const BackendInfo& info = two.info();
  EXPECT_NE(info.description.find("cuda tp=2 (expert parallel) on cuda:0,cuda:1"),
            std::string::npos)
      << info.description;
  ASSERT_EQ(info.devices.size(), 2u);
  EXPECT_EQ(info.devices[0].device, "cuda:0");
  EXPECT_EQ(info.devices[1].device, "cuda:1");
  EXPECT_EQ(info.kv_bytes_per_token, one.info().kv_bytes_per_token);
  for (const DeviceUsage& d : info.devices) {
    EXPECT_GT(d.weight_bytes, 0);
    EXPECT_LT(d.weight_bytes, one.info().devices[0].weight_bytes);
  }
  EXPECT_EQ(info.kv_blocks, two.memory_plan(1).kv_blocks);
}

// random:tiny-moe (16 experts top-4, expert width 128) from one seed on one GPU and on two in
// both MoE modes: the random weights are one model (every rank generates each hub tensor whole
// and keeps its slice), so two GPUs must reproduce one GPU's logits and greedy tokens.
TEST(CudaTensorParallelRandom, TinyMoeMatchesSingleRankInBothModes) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 GPUs and a build with NCCL";
  auto spec = [](int tp, ExpertSplit split) {
    EngineSpec s;
    s.model = "random:tiny-moe";
    s.backend = "cuda";
    s.tensor_parallel_size = tp;
    s.expert_split = split;
    s.random_seed = 20261201;
    s.scheduler = {.max_num_seqs = 8, .max_num_batched_tokens = 64};
    s.kv_cache_bytes = 64 << 20;
    s.max_model_len = 1024;
    return s;
  };
  std::mt19937 rng(std::random_device{}());
  auto one = make_engine(spec(1, ExpertSplit::Intermediate)).engine;
  const int64_t V = one->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> base;
  for (size_t len : {size_t{1}, size_t{37}, size_t{150}}) {
    prompts.push_back(random_prompt(rng, len, V));
    base.push_back(one->score(prompts.back()));
    double sq = 0;
    for (float x : base.back()) sq += static_cast<double>(x) * x;
    ASSERT_GT(sq, 0.0) << "random weights gave all-zero logits";
  }
  auto greedy_prompt = random_prompt(rng, 20, V);
  one->add(request(0, greedy_prompt, 16, true));
  const auto g1 = run_to_completion(*one);
  ASSERT_EQ(g1.size(), 1u);
  for (ExpertSplit split : {ExpertSplit::Intermediate, ExpertSplit::Expert}) {
    auto two = make_engine(spec(2, split)).engine;
    const std::string label = std::string("random:tiny-moe ") + split_name(split) + "2";
    for (size_t i = 0; i < prompts.size(); ++i) {
      expect_rows_close(row_errors(two->score(prompts[i]), base[i], V), false,
                        label + " len " + std::to_string(prompts[i].size()));
    }
    two->add(request(0, greedy_prompt, 16, false));
    const auto g2 = run_to_completion(*two);
    ASSERT_EQ(g2.size(), 1u);
    const size_t checked = expect_greedy_equal(g1[0], g2[0], V, label);
    std::printf("%s: %zu greedy steps checked\n", label.c_str(), checked);
  }
}

// A rank that hangs before its first collective (debug_stall_rank) becomes an Error naming it
// within the collective timeout: the watchdog aborts the communicators, the blocked rank returns,
// the backend stays failed, it can be destroyed, and a rebuilt one works (the service's path).
// With decode graphs (NCCL releases the communicators only when the graphs are destroyed) the
// stuck rank is 1, without them rank 0.
TEST(CudaCollectiveWatchdog, StuckRankBecomesErrorAndBackendRebuilds) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 GPUs and a build with NCCL";
  std::mt19937 rng(std::random_device{}());
  const std::string dir = test_data_dir() + "/qwen3_moe_tiny";
  EngineOptions eo;
  eo.max_num_seqs = 8;
  eo.max_num_batched_tokens = 64;
  for (bool graphs : {true, false}) {
    const int stuck = graphs ? 1 : 0;
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    CudaBackendOptions o = small_options(graphs);
    o.tensor_parallel_size = 2;
    o.collective_timeout_s = 2.0;
    int64_t V = 0;
    Clock::time_point t0;
    {
      auto backend = std::make_unique<CudaBackend>(dir, o);
      CudaBackend* be = backend.get();
      Engine eng(std::move(backend), eo);
      V = eng.config().vocab_size;
      eng.add(request(0, random_prompt(rng, 12, V), 6, false));
      ASSERT_EQ(run_to_completion(eng).size(), 1u);  // healthy steps first
      EXPECT_EQ(be->num_graphs() > 0, graphs);
      be->set_debug_stall_rank(stuck);
      eng.add(request(1, random_prompt(rng, 12, V), 6, false));
      t0 = Clock::now();
      std::string msg;
      try {
        run_to_completion(eng);
      } catch (const Error& e) {
        msg = e.what();
      }
      const double waited = seconds_since(t0);
      EXPECT_NE(msg.find("collective timeout after 2 s on rank " + std::to_string(stuck)),
                std::string::npos)
          << "message: '" << msg << "'";
      EXPECT_GE(waited, 1.9);
      EXPECT_LT(waited, 30.0);
      // Failed for good: the next call throws at once, without touching the communicators.
      std::vector<float> logits;
      t0 = Clock::now();
      EXPECT_THROW(be->forward(one_token_batch(), logits), Error);
      EXPECT_LT(seconds_since(t0), 1.0);
      t0 = Clock::now();
    }  // engine and backend destroyed here: graphs, then the aborted communicators
    EXPECT_LT(seconds_since(t0), 60.0) << "destroying a backend after an abort";
    // Rebuilt, as the service does after an engine failure: healthy again.
    Engine eng(std::make_unique<CudaBackend>(dir, o), eo);
    eng.add(request(2, random_prompt(rng, 12, V), 4, false));
    const auto fin = run_to_completion(eng);
    ASSERT_EQ(fin.size(), 1u);
    EXPECT_EQ(fin[0].tokens.size(), 4u);
  }
}

class AddBias : public test::GpuTest {};

TEST_F(AddBias, MatchesReference) {
  const int rows = 1 + static_cast<int>(rng() % 40), cols = 8 * (1 + static_cast<int>(rng() % 80));
  auto x = test::random_bf16(rng, static_cast<size_t>(rows) * cols, 2.0f);
  auto b = test::random_bf16(rng, static_cast<size_t>(cols), 1.0f);
  test::DevBuf<kernels::bf16> dx(x), db(b);
  kernels::add_bias(dx.get(), db.get(), rows, cols, stream);
  sync();
  auto got = test::to_float(dx.download<uint16_t>());
  std::vector<double> ref(got.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      ref[r * cols + c] = double(test::bf2f(x[r * cols + c])) + test::bf2f(b[c]);
  EXPECT_TRUE(test::close_rel_l2(got, ref, 5e-3)) << trace();
}

}  // namespace
}  // namespace moebatch
