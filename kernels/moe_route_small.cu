// Router for decode batches (≤ 8 tokens) in one launch. At batch 1 the three-launch path
// (cuBLAS GEMM of 128 × 2048, top-k, one-block align) costs ~28 µs per layer, mostly launch ramp
// and tail around ~0.5 MB of weights; here the weights are read by E/4 blocks and the top-k and
// align follow in the last block without another launch. With RouteSmallNorm the MLP's residual
// add + RMSNorm come first in the same launch: every block norms the (few) rows into shared
// memory itself, and the last block, which runs when every block has read the residual, writes
// the residual and the normed rows back (kernel time 13.8 + 7.0 µs for route + add_rmsnorm →
// 14.6 µs at one token on an H200).
#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_routing_device.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 8;  // 16-byte weight loads per lane in flight

// The fused norm's first half, every block: sums[t] = bf16(residual[t] + branch[t]) and hs[t] =
// rmsnorm(sums[t]) · (offset + w) for every token, in shared memory (the whole block meets;
// add_rmsnorm's math, summed in another order).
__device__ void add_norm_rows(const RouteSmallNorm& n, int T, int H, bf16* sums, bf16* hs) {
  __shared__ float partial[kWarps][kRouteSmallMaxTokens];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nvec = H / 8;
  for (int t = 0; t < T; ++t) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
      const size_t o = static_cast<size_t>(t) * H + 8 * i;
      float r[8], b[8];
      load8(n.residual + o, r);
      load8(n.branch + o, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        r[j] = __bfloat162float(__float2bfloat16(r[j] + b[j]));
        ss += r[j] * r[j];
      }
      store8(sums + o, r);  // exact: the sums are bf16 values
    }
    ss = warp_sum(ss);
    if (lane == 0) partial[warp][t] = ss;
  }
  __syncthreads();
  for (int t = 0; t < T; ++t) {
    float ss = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ss += partial[w][t];
    const float rstd = rsqrtf(ss / H + n.eps);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {  // the elements this thread summed
      const size_t o = static_cast<size_t>(t) * H + 8 * i;
      float r[8], w[8];
      load8(sums + o, r);
      load8(n.weight + 8 * i, w);
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = r[j] * rstd * (n.weight_offset + w[j]);
      store8(hs + o, r);
    }
  }
  __syncthreads();
}

// The fused norm's second half, the last block only (every other block has read the residual):
// residual = sums and out = hs, from this block's shared memory (no second read of them).
__device__ void store_norm_rows(const RouteSmallNorm& n, int T, int H, const bf16* sums, const bf16* hs) {
  for (int i = threadIdx.x; i < T * H / 8; i += blockDim.x) {
    const size_t o = 8 * static_cast<size_t>(i);
    *reinterpret_cast<uint4*>(n.residual + o) = *reinterpret_cast<const uint4*>(sums + o);
    *reinterpret_cast<uint4*>(n.out + o) = *reinterpret_cast<const uint4*>(hs + o);
  }
}

__global__ void __launch_bounds__(kWarps * 32) route_small_kernel(RouteSmallParams p) {
  __shared__ float logits[kRouteSmallMaxTokens * kRouterMaxExperts];
  __shared__ bool last;
  extern __shared__ __align__(16) bf16 norm_rows[];  // with the fused norm: sums [T, H], normed [T, H]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int T = p.router.tokens, E = p.router.num_experts, H = p.hidden;
  bf16* const sums = norm_rows;
  bf16* const normed = norm_rows + T * H;
  const bool fused = p.norm.branch != nullptr;

  // Logits: one warp per expert, lanes over 8-wide slices of hidden, all tokens at once. The
  // first slices' weights are loaded before waiting for the kernel before (x is its output).
  const int e = blockIdx.x * kWarps + warp;
  const bf16* w = p.weight + static_cast<size_t>(e) * H;
  float wv[kUnroll][8];
  const auto load_weights = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 256 + lane * 8;
      if (c < H) load8(w + c, wv[u]);
    }
  };
  if (e < E) load_weights(0);
  pdl_sync();
  const bf16* x = p.x;
  if (fused) {
    add_norm_rows(p.norm, T, H, sums, normed);
    x = normed;
  }
  STEP_TRACE_MARK_IF(blockIdx.x == 0 && threadIdx.x == 0);  // normed (diagnostic builds)
  if (e < E) {
    float acc[kRouteSmallMaxTokens] = {};
    for (int c0 = 0; c0 < H; c0 += 256 * kUnroll) {
      if (c0 > 0) load_weights(c0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 256 + lane * 8;
        if (c >= H) break;
#pragma unroll
        for (int t = 0; t < kRouteSmallMaxTokens; ++t) {
          if (t >= T) break;
          float xv[8];
          load8(x + static_cast<size_t>(t) * H + c, xv);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[t] += wv[u][j] * xv[j];
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kRouteSmallMaxTokens; ++t) {
      if (t >= T) break;
      const float s = warp_sum(acc[t]);
      if (lane == 0) p.logits[static_cast<size_t>(t) * E + e] = s;
    }
  }
  STEP_TRACE_MARK_IF(blockIdx.x == 0 && threadIdx.x == 0);  // logits stored
  // Last block done: every block's logits are visible after its writers' fences.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.counter, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  STEP_TRACE_MARK_IF(threadIdx.x == 0);  // the last block has its ticket
  __threadfence();
  if (threadIdx.x == 0) *p.counter = 0;  // ready for the next launch (stream order)
  if (fused) store_norm_rows(p.norm, T, H, sums, normed);
  // __ldcg: L2, never a line this SM's L1 may hold from an earlier block
  for (int i = threadIdx.x; i < T * E; i += blockDim.x) logits[i] = __ldcg(p.logits + i);
  __syncthreads();
  STEP_TRACE_MARK_IF(threadIdx.x == 0);  // every logit in shared memory
  for (int t = warp; t < T; t += kWarps) {
    const float* row = logits + t * E;
    route_token(p.router, t, [row](int x) { return row[x]; });
  }
  STEP_TRACE_MARK_IF(threadIdx.x == 0);  // token 0 routed
  if (p.skip_align) return;
  __syncthreads();  // topk_ids (global, written by this block) are visible to the whole block
  align_block(p.align);
}

}  // namespace

void moe_route_small(const RouteSmallParams& p, cudaStream_t stream) {
  const RouterParams& r = p.router;
  const AlignParams& a = p.align;
  MB_CHECK(r.tokens >= 0 && r.tokens <= kRouteSmallMaxTokens, "moe_route_small: too many tokens");
  MB_CHECK(r.num_experts > 0 && r.num_experts <= kRouterMaxExperts, "moe_route_small: too many experts");
  MB_CHECK(r.top_k > 0 && r.top_k <= kRouterMaxTopK && r.top_k <= r.num_experts, "moe_route_small: bad top_k");
  MB_CHECK(p.hidden > 0 && p.hidden % 8 == 0, "moe_route_small: hidden must be a positive multiple of 8");
  MB_CHECK(p.skip_align ||
               (a.expert0 >= 0 && a.num_experts > 0 && a.expert0 + a.num_experts <= r.num_experts &&
                a.num_pairs == r.tokens * r.top_k && a.topk_ids == r.topk_ids && a.block_m > 0 &&
                a.sorted_ids && a.expert_offsets),
           "moe_route_small: align operands must match the router's");
  MB_CHECK(p.x && p.weight && p.logits && p.counter && r.topk_ids && r.topk_weights,
           "moe_route_small: null operand");
  const RouteSmallNorm& n = p.norm;
  const bool fused = n.branch != nullptr;
  MB_CHECK(!fused || (n.residual && n.weight && n.out && moe_route_small_fuses_norm(r.tokens, p.hidden)),
           "moe_route_small: the fused norm needs residual, weight and out, and rows that fit "
           "kRouteSmallNormBytes");
  if (r.tokens == 0) return;
  const size_t smem = fused ? 2 * static_cast<size_t>(r.tokens) * p.hidden * sizeof(bf16) : 0;
  launch_dependent(route_small_kernel, CEIL_DIV(r.num_experts, kWarps), kWarps * 32, smem, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
