#include <cfloat>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_routing.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kRouterWarps = 4;
constexpr int kPerLane = kRouterMaxExperts / 32;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

// One warp per token. Expert e sits in lane e % 32, slot e / 32.
template <typename T>
__global__ void __launch_bounds__(kRouterWarps * 32) router_topk_kernel(RouterParams p, const T* logits) {
  const int t = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= p.tokens) return;
  const T* row = logits + static_cast<size_t>(t) * p.num_experts;
  float v[kPerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < p.num_experts ? to_float(row[e]) : -FLT_MAX;
    mx = fmaxf(mx, v[j]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < p.num_experts ? expf(v[j] - mx) : -1.f;  // -1: never selected (probs >= 0)
    sum += e < p.num_experts ? v[j] : 0.f;
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;

  float picked_sum = 0.f, my_w = 0.f;
  int my_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float best = -2.f;
    int best_e = INT32_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (v[j] > best) { best = v[j]; best_e = e; }  // ascending e: first max wins
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFullMask, best, o);
      const int oe = __shfl_xor_sync(kFullMask, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) { best = ob; best_e = oe; }
    }
    if ((best_e & 31) == lane) {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j == best_e) v[j] = -2.f;  // taken
    }
    const float w = best * inv;
    picked_sum += w;
    if (lane == k) { my_w = w; my_id = best_e; }
  }
  if (lane < p.top_k) {
    const float scale = p.renormalize ? 1.f / picked_sum : 1.f;
    p.topk_ids[static_cast<size_t>(t) * p.top_k + lane] = my_id;
    p.topk_weights[static_cast<size_t>(t) * p.top_k + lane] = my_w * scale;
  }
}

template <typename T>
void launch_router(const RouterParams& p, const T* logits, cudaStream_t stream) {
  MB_CHECK(p.num_experts > 0 && p.num_experts <= kRouterMaxExperts, "moe_router_topk: too many experts");
  MB_CHECK(p.top_k > 0 && p.top_k <= kRouterMaxTopK && p.top_k <= p.num_experts, "moe_router_topk: bad top_k");
  MB_CHECK(p.topk_ids && p.topk_weights && logits, "moe_router_topk: null operand");
  if (p.tokens == 0) return;
  router_topk_kernel<T><<<CEIL_DIV(p.tokens, kRouterWarps), kRouterWarps * 32, 0, stream>>>(p, logits);
  CUDA_CHECK_LAST();
}

constexpr int kAlignThreads = 1024;
constexpr int kAlignMaxExperts = 1024;

// Single block: shared-memory counting sort by expert. Pairs with an out-of-range expert id are
// dropped (they cannot come from the router).
__global__ void __launch_bounds__(kAlignThreads) moe_align_kernel(AlignParams p) {
  __shared__ int counts[kAlignMaxExperts];
  __shared__ int offsets[kAlignMaxExperts + 1];
  const int E = p.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < p.num_pairs; i += blockDim.x) {
    const int e = p.topk_ids[i];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // E <= 1024 serial steps: cheaper than a block scan's barriers here
    int acc = 0, active = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = acc;
      acc += CEIL_DIV(counts[e], p.block_m) * p.block_m;
      if (p.active_experts != nullptr && counts[e] > 0) p.active_experts[1 + active++] = e;
    }
    offsets[E] = acc;
    if (p.active_experts != nullptr) p.active_experts[0] = active;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) p.expert_offsets[e] = offsets[e];
  for (int i = threadIdx.x; i < offsets[E]; i += blockDim.x) p.sorted_ids[i] = p.num_pairs;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;  // reused as cursors
  __syncthreads();  // also orders the sentinel fill before the scatter (same block)
  for (int i = threadIdx.x; i < p.num_pairs; i += blockDim.x) {
    const int e = p.topk_ids[i];
    if (e >= 0 && e < E) p.sorted_ids[offsets[e] + atomicAdd(&counts[e], 1)] = i;
  }
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
  MB_CHECK(p.block_m > 0 && p.num_pairs >= 0, "moe_align: bad shape");
  MB_CHECK(p.sorted_ids && p.expert_offsets && (p.topk_ids || p.num_pairs == 0), "moe_align: null operand");
  moe_align_kernel<<<1, kAlignThreads, 0, stream>>>(p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
