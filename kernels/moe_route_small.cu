// Router for decode batches (≤ 8 tokens) in one launch. At batch 1 the three-launch path
// (cuBLAS GEMM of 128 × 2048, top-k, one-block align) costs ~28 µs per layer, mostly launch ramp
// and tail around ~0.5 MB of weights; here the weights are read by E/4 blocks and the top-k and
// align follow in the last block without another launch. With RouteSmallNorm the MLP's residual
// add + RMSNorm come first in the same launch: every block norms the (few) rows into shared
// memory itself, and the last block, which runs when every block has read the residual, writes
// the residual and the normed rows back (kernel time 13.8 + 7.0 µs for route + add_rmsnorm →
// 14.6 µs at one token on an H200). Two forms: E/4 blocks whose last to take a ticket routes
// (stores, fence, ticket, reload), and one 16-block cluster whose blocks hand their logits to
// block 0's shared memory (the engine's default where the cluster fits: 10.6 → 6.0 µs of the
// batch-1 layer, H100, 2026-12-06).
#include <cooperative_groups.h>

#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_routing_device.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 8;  // 16-byte weight loads per lane in flight
// The cluster form: 16 blocks (above the portable 8: a block of 16 warps at ~120 registers would
// not fit beside the o_proj GEMV's CTA it launches under) of 8 warps.
constexpr int kClusterBlocks = 16;
constexpr int kClusterWarps = 8;

// The fused norm's first half, every block: sums[t] = bf16(residual[t] + branch[t]) and hs[t] =
// rmsnorm(sums[t]) · (offset + w) for every token, in shared memory (the whole block meets;
// add_rmsnorm's math, summed in another order). The sums of squares are always taken by the
// block's first kNormWarps warps, so both forms of the router (4 and 8 warps a block) sum in
// one order and give the same bits.
constexpr int kNormWarps = 4;
__device__ void add_norm_rows(const RouteSmallNorm& n, int T, int H, bf16* sums, bf16* hs) {
  __shared__ float partial[kNormWarps][kRouteSmallMaxTokens];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nvec = H / 8;
  for (int t = 0; t < T && warp < kNormWarps; ++t) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < nvec; i += kNormWarps * 32) {
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
    for (int w = 0; w < kNormWarps; ++w) ss += partial[w][t];
    const float rstd = rsqrtf(ss / H + n.eps);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
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

// An expert's router weights, kUnroll 16-byte slices of a lane (bf16 as loaded): the first
// slices are requested before the kernel waits for the one before it.
struct ExpertWeights {
  uint4 w[kUnroll];
  __device__ __forceinline__ void load(const bf16* row, int H, int c0, int lane) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 256 + lane * 8;
      if (c < H) w[u] = *reinterpret_cast<const uint4*>(row + c);
    }
  }
};

// Expert e's fp32 logit for every token, on one warp (lanes over 8-wide slices of hidden): the
// warp sum of fixed-order partial dot products, in every lane. `first` holds the slices from 0.
__device__ __forceinline__ void expert_logits(const RouteSmallParams& p, int e, const ExpertWeights& first,
                                              const bf16* x, int T, float (&out)[kRouteSmallMaxTokens]) {
  const int lane = threadIdx.x & 31, H = p.hidden;
  const bf16* row = p.weight + static_cast<size_t>(e) * H;
  ExpertWeights wv = first;
  float acc[kRouteSmallMaxTokens] = {};
  for (int c0 = 0; c0 < H; c0 += 256 * kUnroll) {
    if (c0 > 0) wv.load(row, H, c0, lane);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 256 + lane * 8;
      if (c >= H) break;
      float wf[8];
      unpack8(wv.w[u], wf);
#pragma unroll
      for (int t = 0; t < kRouteSmallMaxTokens; ++t) {
        if (t >= T) break;
        float xv[8];
        load8(x + static_cast<size_t>(t) * H + c, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[t] += wf[j] * xv[j];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kRouteSmallMaxTokens; ++t)
    if (t < T) out[t] = warp_sum(acc[t]);
}

// The last block's tail, both forms: the norm's rows written back, each token's top-k from the
// logits in shared memory, then (unless skipped) the align.
__device__ __forceinline__ void route_tail(const RouteSmallParams& p, const float* logits, const bf16* sums,
                                           const bf16* normed) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int T = p.router.tokens, E = p.router.num_experts;
  if (p.norm.branch != nullptr) store_norm_rows(p.norm, T, p.hidden, sums, normed);
  for (int t = warp; t < T; t += warps) {
    const float* row = logits + t * E;
    route_token(p.router, t, [row](int x) { return row[x]; });
  }
  STEP_TRACE_MARK_IF(threadIdx.x == 0);  // token 0 routed
  if (p.skip_align) return;
  __syncthreads();  // topk_ids (global, written by this block) are visible to the whole block
  align_block(p.align);
}

// E / 4 blocks of 4 warps, a warp per expert; the last block to take a ticket routes.
__global__ void __launch_bounds__(kWarps * 32) route_small_kernel(RouteSmallParams p) {
  __shared__ float logits[kRouteSmallMaxTokens * kRouterMaxExperts];
  __shared__ bool last;
  extern __shared__ __align__(16) bf16 norm_rows[];  // with the fused norm: sums [T, H], normed [T, H]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int T = p.router.tokens, E = p.router.num_experts, H = p.hidden;
  bf16* const sums = norm_rows;
  bf16* const normed = norm_rows + T * H;

  if (p.trigger_early) pdl_trigger_early();
  const int e = blockIdx.x * kWarps + warp;
  ExpertWeights first;
  if (e < E) first.load(p.weight + static_cast<size_t>(e) * H, H, 0, lane);
  pdl_sync();
  const bf16* x = p.x;
  if (p.norm.branch != nullptr) {
    add_norm_rows(p.norm, T, H, sums, normed);
    x = normed;
  }
  STEP_TRACE_MARK_IF(blockIdx.x == 0 && threadIdx.x == 0);  // normed (diagnostic builds)
  if (e < E) {
    float out[kRouteSmallMaxTokens];
    expert_logits(p, e, first, x, T, out);
#pragma unroll
    for (int t = 0; t < kRouteSmallMaxTokens; ++t)
      if (t < T && lane == 0) p.logits[static_cast<size_t>(t) * E + e] = out[t];
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
  // __ldcg: L2, never a line this SM's L1 may hold from an earlier block
  for (int i = threadIdx.x; i < T * E; i += blockDim.x) logits[i] = __ldcg(p.logits + i);
  __syncthreads();
  STEP_TRACE_MARK_IF(threadIdx.x == 0);  // every logit in shared memory
  route_tail(p, logits, sums, normed);
}

// One cluster of kClusterBlocks blocks of kClusterWarps warps (128 warps, as many as the ticket
// form has for 128 experts): warp w takes experts w, w + 128, ... Every block writes its logits
// into block 0's shared memory across the cluster, and block 0 routes once the cluster has met —
// no global stores to wait for, no fence, ticket or reload (~3 µs of the ticket form's ~10 at
// batch 1, H100).
__global__ void __launch_bounds__(kClusterWarps * 32) route_small_cluster_kernel(RouteSmallParams p) {
  __shared__ float logits[kRouteSmallMaxTokens * kRouterMaxExperts];  // block 0's: all of them
  extern __shared__ __align__(16) bf16 norm_rows[];
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int T = p.router.tokens, E = p.router.num_experts, H = p.hidden;
  bf16* const sums = norm_rows;
  bf16* const normed = norm_rows + T * H;

  const int w = static_cast<int>(cluster.block_rank()) * kClusterWarps + warp;
  constexpr int kStride = kClusterBlocks * kClusterWarps;
  if (p.trigger_early) pdl_trigger_early();
  ExpertWeights wv;
  if (w < E) wv.load(p.weight + static_cast<size_t>(w) * H, H, 0, lane);
  cluster.sync();  // every block has started: block 0's shared memory takes remote stores
  pdl_sync();
  const bf16* x = p.x;
  if (p.norm.branch != nullptr) {
    add_norm_rows(p.norm, T, H, sums, normed);
    x = normed;
  }
  STEP_TRACE_MARK_IF(cluster.block_rank() == 0 && threadIdx.x == 0);  // normed (diagnostic builds)
  float* const dst = cluster.map_shared_rank(logits, 0);
  for (int e = w; e < E; e += kStride) {
    float out[kRouteSmallMaxTokens];
    if (e != w) wv.load(p.weight + static_cast<size_t>(e) * H, H, 0, lane);
    expert_logits(p, e, wv, x, T, out);
#pragma unroll
    for (int t = 0; t < kRouteSmallMaxTokens; ++t) {
      if (t < T && lane == 0) {
        dst[t * E + e] = out[t];
        p.logits[static_cast<size_t>(t) * E + e] = out[t];  // an output too
      }
    }
  }
  cluster.sync();  // release / acquire: block 0 sees every block's stores
  if (cluster.block_rank() != 0) return;
  STEP_TRACE_MARK_IF(threadIdx.x == 0);  // every logit in shared memory
  route_tail(p, logits, sums, normed);
}

size_t norm_smem(const RouteSmallParams& p) {
  return p.norm.branch != nullptr ? 2 * static_cast<size_t>(p.router.tokens) * p.hidden * sizeof(bf16) : 0;
}

}  // namespace

bool moe_route_small_prepare_cluster() {
  if (!device_has_clusters()) return false;
  CUDA_CHECK(cudaFuncSetAttribute(route_small_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute dim;
  dim.id = cudaLaunchAttributeClusterDimension;
  dim.val.clusterDim = {static_cast<unsigned>(kClusterBlocks), 1, 1};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = kClusterBlocks;
  cfg.blockDim = kClusterWarps * 32;
  cfg.dynamicSmemBytes = kRouteSmallNormBytes;  // the most the fused norm's rows take
  cfg.attrs = &dim;
  cfg.numAttrs = 1;
  int clusters = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, route_small_cluster_kernel, &cfg));
  return clusters > 0;  // e.g. not on a MIG slice whose GPCs hold fewer blocks
}

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
  const size_t smem = norm_smem(p);
  if (p.cluster)
    launch_dependent_clusters(route_small_cluster_kernel, kClusterBlocks, kClusterWarps * 32, smem, kClusterBlocks,
                              stream, p);
  else
    launch_dependent(route_small_kernel, CEIL_DIV(r.num_experts, kWarps), kWarps * 32, smem, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
