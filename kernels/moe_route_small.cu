// Router for decode batches (≤ 8 tokens) in one launch. At batch 1 the three-launch path
// (cuBLAS GEMM of 128 × 2048, top-k, one-block align) costs ~28 µs per layer, mostly launch ramp
// and tail around ~0.5 MB of weights; here the weights are read by E/4 blocks and the top-k and
// align follow in the last block without another launch.
#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_routing_device.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 8;  // 16-byte weight loads per lane in flight

__global__ void __launch_bounds__(kWarps * 32) route_small_kernel(RouteSmallParams p) {
  __shared__ float logits[kRouteSmallMaxTokens * kRouterMaxExperts];
  __shared__ bool last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int T = p.router.tokens, E = p.router.num_experts, H = p.hidden;

  // Logits: one warp per expert, lanes over 8-wide slices of hidden, all tokens at once.
  const int e = blockIdx.x * kWarps + warp;
  if (e < E) {
    float acc[kRouteSmallMaxTokens] = {};
    const bf16* w = p.weight + static_cast<size_t>(e) * H;
    for (int c0 = 0; c0 < H; c0 += 256 * kUnroll) {
      float wv[kUnroll][8];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 256 + lane * 8;
        if (c < H) load8(w + c, wv[u]);
      }
      // weights in flight; x is the previous kernel's output (kernels/launch.cuh)
      if (c0 == 0) pdl_sync();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 256 + lane * 8;
        if (c >= H) break;
#pragma unroll
        for (int t = 0; t < kRouteSmallMaxTokens; ++t) {
          if (t >= T) break;
          float xv[8];
          load8(p.x + static_cast<size_t>(t) * H + c, xv);
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
  pdl_sync();  // warps without an expert (a no-op for the others)
  // Last block done: every block's logits are visible after its writers' fences.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.counter, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) *p.counter = 0;  // ready for the next launch (stream order)
  // __ldcg: L2, never a line this SM's L1 may hold from an earlier block
  for (int i = threadIdx.x; i < T * E; i += blockDim.x) logits[i] = __ldcg(p.logits + i);
  __syncthreads();
  for (int t = warp; t < T; t += kWarps) {
    const float* row = logits + t * E;
    route_token(p.router, t, [row](int x) { return row[x]; });
  }
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
  MB_CHECK(a.expert0 >= 0 && a.num_experts > 0 && a.expert0 + a.num_experts <= r.num_experts &&
               a.num_pairs == r.tokens * r.top_k && a.topk_ids == r.topk_ids && a.block_m > 0,
           "moe_route_small: align operands must match the router's");
  MB_CHECK(p.x && p.weight && p.logits && p.counter && r.topk_ids && r.topk_weights &&
               a.sorted_ids && a.expert_offsets,
           "moe_route_small: null operand");
  if (r.tokens == 0) return;
  launch_dependent(route_small_kernel, CEIL_DIV(r.num_experts, kWarps), kWarps * 32, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
