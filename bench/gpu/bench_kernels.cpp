// Per-kernel timings on Qwen3-30B-A3B shapes (hidden 2048, 32 q / 4 kv heads of 128, 128 experts
// top-8, moe_intermediate 768, vocab 151936) at batch 1, 64 and 256: CUDA events around each
// launch, median of many after warmup, random data (never zeros). The expert GEMMs rotate over
// several routings so repeated runs do not just re-read L2. Usage: moebatch_bench_kernels [out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/attention.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm.cuh"
#include "kernels/kv_cache.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_ops.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/random.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/sampling.cuh"

namespace {

using namespace moebatch::kernels;

constexpr int kHidden = 2048, kNq = 32, kNkv = 4, kHeadDim = 128, kExperts = 128, kTopK = 8;
constexpr int kInter = 768, kVocab = 151936, kBlock = 16, kRoutings = 8;

/// Device allocation freed at scope exit.
template <typename T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

Buf<bf16>* random_bf16(size_t n, uint64_t seed, float scale, cudaStream_t s) {
  auto* b = new Buf<bf16>(n);
  fill_uniform(b->p, n, seed, scale, s);
  return b;
}

/// Median milliseconds of `iters` timed launches of fn(i) after `warmup` untimed ones.
double median_ms(cudaStream_t s, const std::function<void(int)>& fn, int warmup = 5, int iters = 40) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(a, s));
    fn(i);
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&t[i], a, b));
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[iters / 2];
}

struct Row {
  int batch;
  std::string kernel;
  double ms, bytes, flops;
};

template <typename T>
std::vector<T> upload_vec(T* dst, const std::vector<T>& v) {
  CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string json_path = argc > 1 ? argv[1] : "bench_kernels.json";
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  cublasHandle_t cublas;
  CUBLAS_CHECK(cublasCreate(&cublas));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::mt19937 rng(1234);
  std::vector<Row> rows;

  // Copy ceiling: bytes read + written of a 2 GiB device-to-device copy.
  double copy_tbs = 0;
  {
    Buf<char> a(size_t{2} << 30), b(size_t{2} << 30);
    CUDA_CHECK(cudaMemset(a.p, 1, a.n));
    const double ms = median_ms(s, [&](int) { CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, a.n, cudaMemcpyDeviceToDevice, s)); }, 3, 10);
    copy_tbs = 2.0 * a.n / (ms * 1e-3) / 1e12;
  }

  // Weights (random, from seeds).
  std::unique_ptr<Buf<bf16>> w_gu(random_bf16(size_t(kExperts) * 2 * kInter * kHidden, 1, 0.02f, s));
  std::unique_ptr<Buf<bf16>> w_d(random_bf16(size_t(kExperts) * kHidden * kInter, 2, 0.02f, s));
  std::unique_ptr<Buf<bf16>> lm_head(random_bf16(size_t(kVocab) * kHidden, 3, 0.02f, s));
  std::unique_ptr<Buf<bf16>> w_router(random_bf16(size_t(kExperts) * kHidden, 4, 0.02f, s));
  std::unique_ptr<Buf<bf16>> norm_w(random_bf16(kHidden, 5, 1.f, s));
  std::unique_ptr<Buf<bf16>> qk_w(random_bf16(kHeadDim, 6, 1.f, s));
  const double gu_expert_bytes = 2.0 * 2 * kInter * kHidden, d_expert_bytes = 2.0 * kHidden * kInter;

  for (int B : {1, 64, 256}) {
    const int pairs = B * kTopK;
    std::unique_ptr<Buf<bf16>> x(random_bf16(size_t{256} * kHidden * 4, 10 + B, 1.f, s));
    std::unique_ptr<Buf<bf16>> res(random_bf16(size_t(B) * kHidden, 20 + B, 1.f, s));
    Buf<bf16> normed(size_t(B) * kHidden);
    Buf<int32_t> ids(B);
    std::vector<int32_t> hid(B);
    for (auto& v : hid) v = static_cast<int32_t>(rng() % kVocab);
    upload_vec(ids.p, hid);
    rows.push_back({B, "embedding", median_ms(s, [&](int) { embedding_gather(normed.p, lm_head->p, ids.p, B, kHidden, kVocab, s); }),
                    4.0 * B * kHidden, 0});
    RmsNormParams rp;
    rp.out = normed.p;
    rp.in = x->p;
    rp.residual = res->p;
    rp.weight = norm_w->p;
    rp.rows = B;
    rp.cols = kHidden;
    rows.push_back({B, "add_rmsnorm", median_ms(s, [&](int) { add_rmsnorm(rp, s); }), 2.0 * B * kHidden * 4, 0});

    // q/k norm + rope on a fused qkv row, then the cache write.
    const int qkv_w = (kNq + 2 * kNkv) * kHeadDim;
    std::unique_ptr<Buf<bf16>> qkv(random_bf16(size_t(B) * qkv_w, 30 + B, 1.f, s));
    Buf<int32_t> pos(B);
    std::vector<int32_t> hpos(B, 191);
    upload_vec(pos.p, hpos);
    QkNormRopeParams qp;
    qp.q = qkv->p;
    qp.k = qkv->p + kNq * kHeadDim;
    qp.q_stride = qp.k_stride = qkv_w;
    qp.q_norm = qp.k_norm = qk_w->p;
    qp.positions = pos.p;
    qp.tokens = B;
    qp.n_q_heads = kNq;
    qp.n_kv_heads = kNkv;
    qp.head_dim = kHeadDim;
    rows.push_back({B, "qk_norm_rope", median_ms(s, [&](int) { qk_norm_rope(qp, s); }), 4.0 * B * (kNq + kNkv) * kHeadDim, 0});

    for (int ctx : {192, 2048}) {
      const int blocks_per_seq = CEIL_DIV(ctx, kBlock);
      const size_t num_blocks = size_t(B) * blocks_per_seq;
      const size_t cache_elems = num_blocks * kBlock * kNkv * kHeadDim;
      std::unique_ptr<Buf<bf16>> kc(random_bf16(cache_elems, 40 + B + ctx, 1.f, s));
      std::unique_ptr<Buf<bf16>> vc(random_bf16(cache_elems, 50 + B + ctx, 1.f, s));
      std::vector<int32_t> perm(num_blocks), hslot(B), hqs(B + 1), hkv(B, ctx);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int b = 0; b < B; ++b) {
        hslot[b] = perm[size_t(b) * blocks_per_seq + (ctx - 1) / kBlock] * kBlock + (ctx - 1) % kBlock;
        hqs[b + 1] = b + 1;
      }
      Buf<int32_t> tables(num_blocks), slots(B), qs(B + 1), kvl(B);
      upload_vec(tables.p, perm);
      upload_vec(slots.p, hslot);
      upload_vec(qs.p, hqs);
      upload_vec(kvl.p, hkv);
      if (ctx == 192) {
        KvCacheWriteParams kp;
        kp.k_cache = kc->p;
        kp.v_cache = vc->p;
        kp.k = qkv->p + kNq * kHeadDim;
        kp.v = qkv->p + (kNq + kNkv) * kHeadDim;
        kp.k_stride = kp.v_stride = qkv_w;
        kp.slot_mapping = slots.p;
        kp.tokens = B;
        kp.n_kv_heads = kNkv;
        kp.head_dim = kHeadDim;
        rows.push_back({B, "kv_cache_write", median_ms(s, [&](int) { kv_cache_write(kp, s); }), 4.0 * B * 2 * kNkv * kHeadDim, 0});
      }
      const int splits = attention_decode_splits(B, kNkv, ctx, prop.multiProcessorCount, 32);
      Buf<float> ws(std::max<size_t>(1, attention_workspace_floats(B, kNq, kHeadDim, splits)));
      Buf<bf16> out(size_t(B) * kNq * kHeadDim);
      AttentionParams ap;
      ap.out = out.p;
      ap.q = qkv->p;
      ap.q_stride = qkv_w;
      ap.k_cache = kc->p;
      ap.v_cache = vc->p;
      ap.block_tables = tables.p;
      ap.q_start = qs.p;
      ap.kv_lens = kvl.p;
      ap.num_seqs = B;
      ap.num_tokens = B;
      ap.max_q_len = 1;
      ap.max_kv_len = ctx;
      ap.max_blocks_per_seq = blocks_per_seq;
      ap.block_size = kBlock;
      ap.n_q_heads = kNq;
      ap.n_kv_heads = kNkv;
      ap.head_dim = kHeadDim;
      ap.scale = 0.0883883f;
      ap.num_splits = splits;
      ap.workspace = ws.p;
      const double kv_bytes = 2.0 * 2 * B * double(ctx) * kNkv * kHeadDim;
      rows.push_back({B, "attn_decode ctx" + std::to_string(ctx) + " splits" + std::to_string(splits),
                      median_ms(s, [&](int) { attention_decode(ap, s); }), kv_bytes + 4.0 * B * kNq * kHeadDim,
                      4.0 * B * kNq * double(ctx) * kHeadDim});
    }

    // Router: logits GEMM (cuBLAS, fp32 out) + softmax/top-k.
    Buf<float> logits(size_t(B) * kExperts);
    Buf<int32_t> topk_ids(pairs);
    Buf<float> topk_w(pairs);
    rows.push_back({B, "router_gemm (cuBLAS)", median_ms(s, [&](int) { linear(cublas, s, logits.p, normed.p, w_router->p, B, kExperts, kHidden); }),
                    2.0 * kExperts * kHidden, 2.0 * B * kExperts * kHidden});
    RouterParams rtp;
    rtp.topk_ids = topk_ids.p;
    rtp.topk_weights = topk_w.p;
    rtp.tokens = B;
    rtp.num_experts = kExperts;
    rtp.top_k = kTopK;
    rows.push_back({B, "router_topk", median_ms(s, [&](int) { moe_router_topk(rtp, logits.p, s); }), 4.0 * B * kExperts, 0});

    // Several random routings, aligned once each, rotated through by the GEMM timings.
    const int cap = moe_align_capacity(pairs, kExperts, kMoeGemmTileM);
    std::vector<std::unique_ptr<Buf<int32_t>>> r_ids, r_sorted, r_off, r_active;
    double experts_hit = 0;
    for (int r = 0; r < kRoutings; ++r) {
      std::vector<int32_t> h(pairs);
      std::vector<int> all(kExperts);
      std::iota(all.begin(), all.end(), 0);
      std::set<int> hit;
      for (int t = 0; t < B; ++t) {
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < kTopK; ++j) hit.insert(h[t * kTopK + j] = all[j]);
      }
      experts_hit += hit.size() / double(kRoutings);
      r_ids.emplace_back(new Buf<int32_t>(pairs));
      r_sorted.emplace_back(new Buf<int32_t>(cap));
      r_off.emplace_back(new Buf<int32_t>(kExperts + 1));
      r_active.emplace_back(new Buf<int32_t>(kExperts + 1));
      upload_vec(r_ids.back()->p, h);
    }
    auto align_params = [&](int r) {
      AlignParams a;
      a.sorted_ids = r_sorted[r]->p;
      a.expert_offsets = r_off[r]->p;
      a.topk_ids = r_ids[r]->p;
      a.num_pairs = pairs;
      a.num_experts = kExperts;
      a.block_m = kMoeGemmTileM;
      a.active_experts = r_active[r]->p;
      return a;
    };
    rows.push_back({B, "moe_align", median_ms(s, [&](int i) { moe_align(align_params(i % kRoutings), s); }), 8.0 * pairs, 0});
    for (int r = 0; r < kRoutings; ++r) moe_align(align_params(r), s);

    Buf<bf16> gu(size_t(pairs) * 2 * kInter), act(size_t(pairs) * kInter), down(size_t(pairs) * kHidden), moe_out(size_t(B) * kHidden);
    fill_uniform(act.p, act.n, 70 + B, 1.f, s);
    auto gemm_params = [&](int r, bool gate_up) {
      MoeGemmParams p;
      p.sorted_ids = r_sorted[r]->p;
      p.expert_offsets = r_off[r]->p;
      p.active_experts = r_active[r]->p;  // as the engine launches them
      p.num_pairs = pairs;
      p.num_experts = kExperts;
      p.out = gate_up ? gu.p : down.p;
      p.in = gate_up ? normed.p : act.p;
      p.weight = gate_up ? w_gu->p : w_d->p;
      p.in_row_div = gate_up ? kTopK : 1;
      p.n = gate_up ? 2 * kInter : kHidden;
      p.k = gate_up ? kHidden : kInter;
      return p;
    };
    const double gu_bytes = experts_hit * gu_expert_bytes + 2.0 * B * kHidden + 2.0 * pairs * 2 * kInter;
    const double d_bytes = experts_hit * d_expert_bytes + 2.0 * pairs * kInter + 2.0 * pairs * kHidden;
    const double gu_ms = median_ms(s, [&](int i) { moe_gemm(gemm_params(i % kRoutings, true), s); });
    const double d_ms = median_ms(s, [&](int i) { moe_gemm(gemm_params(i % kRoutings, false), s); });
    rows.push_back({B, "moe_gemm gate_up", gu_ms, gu_bytes, 2.0 * pairs * 2 * kInter * kHidden});
    rows.push_back({B, "moe_gemm down", d_ms, d_bytes, 2.0 * pairs * kHidden * kInter});
    // The engine's path: gate+up with SiLU·mul in the epilogue, writing [pairs, I].
    const double gus_ms = median_ms(s, [&](int i) {
      MoeGemmParams p = gemm_params(i % kRoutings, true);
      p.out = act.p;
      p.n = kInter;
      p.silu_gate_up = true;
      moe_gemm(p, s);
    });
    rows.push_back({B, "moe_gemm gate_up+silu", gus_ms, gu_bytes - 2.0 * pairs * kInter, 2.0 * pairs * 2 * kInter * kHidden});
    rows.push_back({B, "silu_mul", median_ms(s, [&](int) { silu_mul(act.p, gu.p, pairs, kInter, s); }), 2.0 * pairs * 3 * kInter, 0});
    rows.push_back({B, "moe_combine", median_ms(s, [&](int) { moe_combine(moe_out.p, down.p, topk_w.p, B, kTopK, kHidden, s); }),
                    2.0 * pairs * kHidden + 2.0 * B * kHidden, 0});

    // cuBLAS comparison: the same weight bytes as equal-size groups (strided batched GEMM over
    // the experts hit, rows per expert = pairs / experts hit rounded up).
    {
      const int groups = static_cast<int>(experts_hit + 0.5);
      const int m = CEIL_DIV(pairs, groups);
      std::unique_ptr<Buf<bf16>> xin(random_bf16(size_t(groups) * m * kHidden, 80 + B, 1.f, s));
      Buf<bf16> cout(size_t(groups) * m * 2 * kInter);
      const float alpha = 1.f, beta = 0.f;
      CUBLAS_CHECK(cublasSetStream(cublas, s));
      const double ms = median_ms(s, [&](int i) {
        // Rotate the expert window so the weights are not L2-resident between runs.
        const int first = (i * groups) % (kExperts - groups + 1);
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            cublas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * kInter, m, kHidden, &alpha,
            w_gu->p + size_t(first) * 2 * kInter * kHidden, CUDA_R_16BF, kHidden, int64_t{2} * kInter * kHidden,
            xin->p, CUDA_R_16BF, kHidden, int64_t(m) * kHidden, &beta, cout.p, CUDA_R_16BF, 2 * kInter,
            int64_t(m) * 2 * kInter, groups, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      rows.push_back({B, "cublas batched gate_up (" + std::to_string(groups) + "x" + std::to_string(m) + ")", ms,
                      groups * gu_expert_bytes, 2.0 * groups * m * 2 * kInter * kHidden});
    }

    // lm_head (cuBLAS) and sampling.
    Buf<float> vlogits(size_t(B) * kVocab);
    rows.push_back({B, "lm_head (cuBLAS)", median_ms(s, [&](int) { linear(cublas, s, vlogits.p, normed.p, lm_head->p, B, kVocab, kHidden); }),
                    2.0 * kVocab * kHidden + 4.0 * B * kVocab, 2.0 * B * kVocab * kHidden});
    Buf<int32_t> tokens(B), topk(B);
    Buf<float> temp(B), topp(B);
    Buf<uint64_t> seeds(B), steps(B);
    upload_vec(topk.p, std::vector<int32_t>(B, 50));
    upload_vec(temp.p, std::vector<float>(B, 0.8f));
    upload_vec(topp.p, std::vector<float>(B, 0.95f));
    std::vector<uint64_t> hs(B);
    std::iota(hs.begin(), hs.end(), 0);
    upload_vec(seeds.p, hs);
    upload_vec(steps.p, hs);
    rows.push_back({B, "sample_greedy", median_ms(s, [&](int) { sample_greedy(tokens.p, vlogits.p, B, kVocab, s); }), 4.0 * B * kVocab, 0});
    SamplingParams sp;
    sp.out_tokens = tokens.p;
    sp.logits = vlogits.p;
    sp.temperature = temp.p;
    sp.top_k = topk.p;
    sp.top_p = topp.p;
    sp.seeds = seeds.p;
    sp.steps = steps.p;
    sp.batch = B;
    sp.vocab = kVocab;
    rows.push_back({B, "sample_top_k_top_p (k50 p.95)", median_ms(s, [&](int) { sample_top_k_top_p(sp, s); }), 4.0 * B * kVocab, 0});
    std::printf("batch %d: experts hit %.1f\n", B, experts_hit);
  }

  // Prefill attention: 8 prompts of 512 tokens, causal.
  {
    const int seqs = 8, len = 512, T = seqs * len, bps = len / kBlock;
    const size_t cache_elems = size_t(seqs) * len * kNkv * kHeadDim;
    std::unique_ptr<Buf<bf16>> kc(random_bf16(cache_elems, 91, 1.f, s)), vc(random_bf16(cache_elems, 92, 1.f, s));
    std::unique_ptr<Buf<bf16>> q(random_bf16(size_t(T) * kNq * kHeadDim, 93, 1.f, s));
    Buf<bf16> out(size_t(T) * kNq * kHeadDim);
    std::vector<int32_t> tab(size_t(seqs) * bps), hqs(seqs + 1), hkv(seqs, len);
    std::iota(tab.begin(), tab.end(), 0);
    for (int i = 0; i <= seqs; ++i) hqs[i] = i * len;
    Buf<int32_t> tables(tab.size()), qs(seqs + 1), kvl(seqs);
    upload_vec(tables.p, tab);
    upload_vec(qs.p, hqs);
    upload_vec(kvl.p, hkv);
    AttentionParams ap;
    ap.out = out.p;
    ap.q = q->p;
    ap.q_stride = kNq * kHeadDim;
    ap.k_cache = kc->p;
    ap.v_cache = vc->p;
    ap.block_tables = tables.p;
    ap.q_start = qs.p;
    ap.kv_lens = kvl.p;
    ap.num_seqs = seqs;
    ap.num_tokens = T;
    ap.max_q_len = len;
    ap.max_kv_len = len;
    ap.max_blocks_per_seq = bps;
    ap.n_q_heads = kNq;
    ap.n_kv_heads = kNkv;
    ap.head_dim = kHeadDim;
    ap.scale = 0.0883883f;
    rows.push_back({T, "attn_prefill 8x512 causal", median_ms(s, [&](int) { attention_prefill(ap, s); }, 2, 10),
                    2.0 * T * kNq * kHeadDim * 2 + 2.0 * cache_elems * 2, 4.0 * seqs * (len * (len + 1) / 2.0) * kNq * kHeadDim});
  }
  CUDA_CHECK(cudaStreamSynchronize(s));

  nlohmann::json j;
  j["gpu"] = prop.name;
  j["sms"] = prop.multiProcessorCount;
  j["copy_TBps"] = copy_tbs;
  std::printf("\n%s, %d SMs, device copy %.2f TB/s (read + write)\n", prop.name, prop.multiProcessorCount, copy_tbs);
  std::printf("%-6s %-44s %10s %9s %8s %9s\n", "batch", "kernel", "us", "GB/s", "%copy", "TFLOP/s");
  for (const auto& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9, tf = r.flops / (r.ms * 1e-3) / 1e12;
    std::printf("%-6d %-44s %10.1f %9.0f %7.0f%% %9.2f\n", r.batch, r.kernel.c_str(), r.ms * 1e3, gbs,
                100.0 * gbs / (copy_tbs * 1e3), tf);
    j["rows"].push_back({{"batch", r.batch}, {"kernel", r.kernel}, {"us", r.ms * 1e3}, {"GBps", gbs}, {"TFLOPs", tf}, {"bytes", r.bytes}});
  }
  std::ofstream(json_path) << j.dump(2) << "\n";
  CUBLAS_CHECK(cublasDestroy(cublas));
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
