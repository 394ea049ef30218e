// Device halves of the routing ops, shared by the standalone kernels (moe_routing.cu) and the
// fused small-batch router (moe_route_small.cu): per-token softmax + top-k on one warp, and the
// one-block counting sort by expert.
#pragma once

#include <cfloat>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/moe_routing.cuh"

namespace moebatch::kernels {

// Order-preserving keys for the warp reductions of the router (`__reduce_{max,min}_sync`: one
// instruction where a shuffle tree takes five dependent steps).
// A logit, finite or ±inf: unsigned order follows float order.
__device__ __forceinline__ unsigned logit_key(float x) {
  const unsigned b = __float_as_uint(x);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float logit_of_key(unsigned k) {
  return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}
// A probability p ≥ 0 as bits(p) + 1 (non-negative floats' bits sort as the floats do); 0 is
// "not a candidate" (taken, or past the experts); NaN keys as 1, with the zero probabilities.
__device__ __forceinline__ unsigned prob_key(float p) { return p != p ? 1u : __float_as_uint(p) + 1u; }

// Token t's softmax over the experts and its top-k, on one warp (every lane calls it); kPer
// experts per lane, expert e in lane e % 32, slot e / 32. Selection: the highest probability,
// ties to the lower expert id. Each round is two warp reductions (the best key, then the lowest
// id holding it) and a rescan of the winning lane's kPer slots: 128 experts, top 8 took ~2.5 µs
// of the batch-1 router as a shuffle tree over 16 slots a lane.
template <int kPer, typename Logit>
__device__ __forceinline__ void route_token_slots(const RouterParams& p, int t, Logit logit) {
  const int lane = threadIdx.x & 31;
  float v[kPer];
  float mx = -FLT_MAX;  // fmaxf: NaN logits are passed over
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < p.num_experts ? logit(e) : -FLT_MAX;
    mx = fmaxf(mx, v[j]);
  }
  mx = logit_of_key(__reduce_max_sync(kFullMask, logit_key(mx)));
  float sum = 0.f;
  unsigned key[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const bool expert = lane + 32 * j < p.num_experts;
    const float prob = expf(v[j] - mx);
    sum += expert ? prob : 0.f;
    key[j] = expert ? prob_key(prob) : 0u;
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;

  // the lane's best slot: highest key, lowest slot on ties
  unsigned best = 0;
  int best_j = 0;
  const auto rescan = [&] {
    best = key[0];
    best_j = 0;
#pragma unroll
    for (int j = 1; j < kPer; ++j)
      if (key[j] > best) { best = key[j]; best_j = j; }
  };
  rescan();
  float picked_sum = 0.f, my_w = 0.f;
  int my_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    const unsigned top = __reduce_max_sync(kFullMask, best);
    const int mine = lane + 32 * best_j;
    const int e = static_cast<int>(__reduce_min_sync(kFullMask, best == top ? static_cast<unsigned>(mine) : ~0u));
    if (e == mine) {  // taken
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (j == best_j) key[j] = 0u;
      rescan();
    }
    const float w = __uint_as_float(top - 1u) * inv;
    picked_sum += w;
    if (lane == k) { my_w = w; my_id = e; }
  }
  if (lane < p.top_k) {
    const float scale = p.renormalize ? 1.f / picked_sum : 1.f;
    p.topk_ids[static_cast<size_t>(t) * p.top_k + lane] = my_id;
    p.topk_weights[static_cast<size_t>(t) * p.top_k + lane] = my_w * scale;
  }
}

// route_token_slots with as few slots a lane as the experts need (registers and the rescan).
template <typename Logit>
__device__ __forceinline__ void route_token(const RouterParams& p, int t, Logit logit) {
  static_assert(kRouterMaxExperts == 512, "the slot counts below cover 32 · 16 experts");
  if (p.num_experts <= 32) return route_token_slots<1>(p, t, logit);
  if (p.num_experts <= 64) return route_token_slots<2>(p, t, logit);
  if (p.num_experts <= 128) return route_token_slots<4>(p, t, logit);
  if (p.num_experts <= 256) return route_token_slots<8>(p, t, logit);
  route_token_slots<16>(p, t, logit);
}

constexpr int kAlignMaxExperts = 1024;

// The align's passes over a range of pairs [begin, end) with a stride of blockDim.x per thread:
// fn(i, e) for each pair i whose local expert e = topk_ids[i] − expert0 lies in [0, E) (other
// ranks' experts under expert parallelism are dropped; the router never makes a bad id). kBatch
// pairs per thread are loaded before any is used: one block walks a prefill's 65k pairs, and a
// load round trip per pair made it latency-bound (~47 µs).
template <typename Fn>
__device__ __forceinline__ void align_pairs(const AlignParams& p, int begin, int end, Fn fn) {
  constexpr int kBatch = 8;
  const int stride = static_cast<int>(blockDim.x);
  for (int i0 = begin + static_cast<int>(threadIdx.x); i0 < end; i0 += kBatch * stride) {
    int e[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * stride;
      e[j] = i < end ? p.topk_ids[i] - p.expert0 : -1;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (e[j] >= 0 && e[j] < p.num_experts) fn(i0 + j * stride, e[j]);
  }
}

// Every thread of the block: segment starts offsets[0..E] (shared) from the per-expert counts
// (shared), each padded to block_m, and — when `active` is given — the experts with pairs,
// ascending, after their number. Ends with a barrier.
__device__ __forceinline__ void align_offsets(const AlignParams& p, const int* counts, int* offsets,
                                              int32_t* active) {
  // Offsets (padded counts) and the active list by prefix sums: each thread owns a run of
  // consecutive experts (a serial pass over 512 experts costs ~10 µs on one thread).
  __shared__ int scratch[32];
  const int E = p.num_experts;
  const int per = CEIL_DIV(E, static_cast<int>(blockDim.x));
  const int e0 = min(E, static_cast<int>(threadIdx.x) * per), e1 = min(E, e0 + per);
  int padded = 0, n_active = 0;
  for (int e = e0; e < e1; ++e) {
    padded += CEIL_DIV(counts[e], p.block_m) * p.block_m;
    n_active += counts[e] > 0;
  }
  int total_padded = 0, total_active = 0;
  int acc = block_inclusive_scan(padded, scratch, &total_padded) - padded;
  int act = block_inclusive_scan(n_active, scratch, &total_active) - n_active;
  for (int e = e0; e < e1; ++e) {
    offsets[e] = acc;
    acc += CEIL_DIV(counts[e], p.block_m) * p.block_m;
    if (active != nullptr && counts[e] > 0) active[1 + act++] = e;
  }
  if (threadIdx.x == 0) {
    offsets[E] = total_padded;
    if (active != nullptr) active[0] = total_active;
  }
  __syncthreads();
}

// moe_align on one block (a multiple of 32 threads; every thread calls it). topk_ids must be
// visible to the whole block.
__device__ __forceinline__ void align_block(const AlignParams& p) {
  __shared__ int counts[kAlignMaxExperts];
  __shared__ int offsets[kAlignMaxExperts + 1];
  const int E = p.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  align_pairs(p, 0, p.num_pairs, [&](int, int e) { atomicAdd(&counts[e], 1); });
  __syncthreads();
  align_offsets(p, counts, offsets, p.active_experts);  // offsets complete before anyone reads them
  for (int e = threadIdx.x; e <= E; e += blockDim.x) p.expert_offsets[e] = offsets[e];
  for (int i = threadIdx.x; i < offsets[E]; i += blockDim.x) p.sorted_ids[i] = p.num_pairs;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;  // reused as cursors
  __syncthreads();  // also orders the sentinel fill before the scatter (same block)
  align_pairs(p, 0, p.num_pairs,
              [&](int i, int e) { p.sorted_ids[offsets[e] + atomicAdd(&counts[e], 1)] = i; });
}

}  // namespace moebatch::kernels
