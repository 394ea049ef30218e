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
  launch_dependent(moe_align_kernel, 1, kAlignThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
