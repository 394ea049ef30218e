// Device halves of the routing ops, shared by the standalone kernels (moe_routing.cu) and the
// fused small-batch router (moe_route_small.cu): per-token softmax + top-k on one warp, and the
// one-block counting sort by expert.
#pragma once

#include <cfloat>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_routing.cuh"

namespace moebatch::kernels {

constexpr int kRouterPerLane = kRouterMaxExperts / 32;

// Token t's softmax over the experts and its top-k, on one warp (every lane calls it).
// logit(e) returns expert e's logit; expert e sits in lane e % 32, slot e / 32.
template <typename Logit>
__device__ __forceinline__ void route_token(const RouterParams& p, int t, Logit logit) {
  const int lane = threadIdx.x & 31;
  float v[kRouterPerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < kRouterPerLane; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < p.num_experts ? logit(e) : -FLT_MAX;
    mx = fmaxf(mx, v[j]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kRouterPerLane; ++j) {
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
    for (int j = 0; j < kRouterPerLane; ++j) {
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
      for (int j = 0; j < kRouterPerLane; ++j)
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

constexpr int kAlignMaxExperts = 1024;

// moe_align on one block (a multiple of 32 threads; every thread calls it). topk_ids must be visible to
// the whole block. Local expert e = topk_ids - expert0; pairs whose e lies outside [0, E) are
// dropped: another rank's experts under expert parallelism (the router never makes a bad id).
__device__ __forceinline__ void align_block(const AlignParams& p) {
  __shared__ int counts[kAlignMaxExperts];
  __shared__ int offsets[kAlignMaxExperts + 1];
  const int E = p.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < p.num_pairs; i += blockDim.x) {
    const int e = p.topk_ids[i] - p.expert0;
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  {
    // Offsets (padded counts) and the active list by prefix sums: each thread owns a run of
    // consecutive experts (a serial pass over 512 experts costs ~10 µs on one thread).
    __shared__ int scratch[32];
    const int per = CEIL_DIV(E, static_cast<int>(blockDim.x));
    const int e0 = min(E, static_cast<int>(threadIdx.x) * per), e1 = min(E, e0 + per);
    int padded = 0, active = 0;
    for (int e = e0; e < e1; ++e) {
      padded += CEIL_DIV(counts[e], p.block_m) * p.block_m;
      active += counts[e] > 0;
    }
    int total_padded = 0, total_active = 0;
    int acc = block_inclusive_scan(padded, scratch, &total_padded) - padded;
    int act = block_inclusive_scan(active, scratch, &total_active) - active;
    for (int e = e0; e < e1; ++e) {
      offsets[e] = acc;
      acc += CEIL_DIV(counts[e], p.block_m) * p.block_m;
      if (p.active_experts != nullptr && counts[e] > 0) p.active_experts[1 + act++] = e;
    }
    if (threadIdx.x == 0) {
      offsets[E] = total_padded;
      if (p.active_experts != nullptr) p.active_experts[0] = total_active;
    }
  }
  __syncthreads();  // offsets complete before anyone reads them or reuses counts
  for (int e = threadIdx.x; e <= E; e += blockDim.x) p.expert_offsets[e] = offsets[e];
  for (int i = threadIdx.x; i < offsets[E]; i += blockDim.x) p.sorted_ids[i] = p.num_pairs;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;  // reused as cursors
  __syncthreads();  // also orders the sentinel fill before the scatter (same block)
  for (int i = threadIdx.x; i < p.num_pairs; i += blockDim.x) {
    const int e = p.topk_ids[i] - p.expert0;
    if (e >= 0 && e < E) p.sorted_ids[offsets[e] + atomicAdd(&counts[e], 1)] = i;
  }
}

}  // namespace moebatch::kernels
