#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/launch.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_routing_device.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kRouterWarps = 4;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

// One warp per token.
template <typename T>
__global__ void __launch_bounds__(kRouterWarps * 32) router_topk_kernel(RouterParams p, const T* logits) {
  pdl_sync();
  const int t = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (t >= p.tokens) return;
  const T* row = logits + static_cast<size_t>(t) * p.num_experts;
  route_token(p, t, [row](int e) { return to_float(row[e]); });
}

template <typename T>
void launch_router(const RouterParams& p, const T* logits, cudaStream_t stream) {
  MB_CHECK(p.num_experts > 0 && p.num_experts <= kRouterMaxExperts, "moe_router_topk: too many experts");
  MB_CHECK(p.top_k > 0 && p.top_k <= kRouterMaxTopK && p.top_k <= p.num_experts, "moe_router_topk: bad top_k");
  MB_CHECK(p.topk_ids && p.topk_weights && logits, "moe_router_topk: null operand");
  if (p.tokens == 0) return;
  launch_dependent(router_topk_kernel<T>, CEIL_DIV(p.tokens, kRouterWarps), kRouterWarps * 32, 0,
                   stream, p, logits);
  CUDA_CHECK_LAST();
}

constexpr int kAlignThreads = 1024;

// Single block: shared-memory counting sort by expert.
__global__ void __launch_bounds__(kAlignThreads) moe_align_kernel(AlignParams p) {
  pdl_sync();
  align_block(p);
}

// The many-pairs align: block b of both launches owns the pairs [b·chunk, (b + 1)·chunk).
// Count: the block's pairs per expert into workspace row b.
constexpr int kAlignBlockThreads = 256;
constexpr int kAlignPairsPerBlock = 2048;  // at least, before another block is worth its launch

__global__ void __launch_bounds__(kAlignBlockThreads) moe_align_count_kernel(AlignParams p, int chunk) {
  __shared__ int counts[kAlignMaxExperts];
  pdl_sync();
  const int E = p.num_experts, begin = blockIdx.x * chunk, end = min(p.num_pairs, begin + chunk);
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  align_pairs(p, begin, end, [&](int, int e) { atomicAdd(&counts[e], 1); });
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) p.workspace[blockIdx.x * E + e] = counts[e];
}

// Place: every block sums the counts of all blocks (the same offsets everywhere) and of the
// blocks before it (where its pairs start inside each segment), then scatters its pairs; block 0
// writes the offsets, the active list and the segments' padding sentinels (positions no pair
// takes, so the scatter of the other blocks never meets them).
__global__ void __launch_bounds__(kAlignBlockThreads) moe_align_place_kernel(AlignParams p, int chunk) {
  __shared__ int counts[kAlignMaxExperts];
  __shared__ int start[kAlignMaxExperts];  // this block's first position in each segment
  __shared__ int offsets[kAlignMaxExperts + 1];
  pdl_sync();
  const int E = p.num_experts, blocks = gridDim.x, me = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int total = 0, before = 0;
#pragma unroll 8
    for (int b = 0; b < blocks; ++b) {
      const int c = p.workspace[b * E + e];
      total += c;
      before += b < me ? c : 0;
    }
    counts[e] = total;
    start[e] = before;
  }
  __syncthreads();
  align_offsets(p, counts, offsets, me == 0 ? p.active_experts : nullptr);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    start[e] += offsets[e];
    if (me == 0)
      for (int i = offsets[e] + counts[e]; i < offsets[e + 1]; ++i) p.sorted_ids[i] = p.num_pairs;
    counts[e] = 0;  // reused as cursors
  }
  if (me == 0)
    for (int e = threadIdx.x; e <= E; e += blockDim.x) p.expert_offsets[e] = offsets[e];
  __syncthreads();
  const int begin = me * chunk, end = min(p.num_pairs, begin + chunk);
  align_pairs(p, begin, end, [&](int i, int e) { p.sorted_ids[start[e] + atomicAdd(&counts[e], 1)] = i; });
}

}  // namespace

void moe_router_topk(const RouterParams& p, const float* logits, cudaStream_t stream) {
  launch_router(p, logits, stream);
}

void moe_router_topk(const RouterParams& p, const bf16* logits, cudaStream_t stream) {
  launch_router(p, logits, stream);
}

void moe_align(const AlignParams& p, cudaStream_t stream) {
  MB_CHECK(p.num_experts > 0 && p.num_experts <= kAlignMaxExperts, "moe_align: 1..1024 experts");
  MB_CHECK(p.block_m > 0 && p.num_pairs >= 0 && p.expert0 >= 0, "moe_align: bad shape");
  MB_CHECK(p.sorted_ids && p.expert_offsets && (p.topk_ids || p.num_pairs == 0), "moe_align: null operand");
  const int blocks = static_cast<int>(std::min<int64_t>(kAlignMaxBlocks, p.num_pairs / kAlignPairsPerBlock));
  if (p.workspace != nullptr && blocks >= 2) {
    const int chunk = CEIL_DIV(p.num_pairs, blocks);
    launch_dependent(moe_align_count_kernel, blocks, kAlignBlockThreads, 0, stream, p, chunk);
    launch_dependent(moe_align_place_kernel, blocks, kAlignBlockThreads, 0, stream, p, chunk);
  } else {
    launch_dependent(moe_align_kernel, 1, kAlignThreads, 0, stream, p);
  }
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
