#include <cfloat>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/random.cuh"
#include "kernels/sampling.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kThreads = 1024;
static_assert(kSamplingMaxK == kThreads, "the bitonic sort gives each thread one candidate");

// Monotone map of floats onto uint32 (larger float -> larger key), for radix selection.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (value desc, index asc): does a come before b?
__device__ __forceinline__ bool before(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// Block argmax of a row; the result is returned to every thread.
__device__ int block_argmax(const float* row, int vocab) {
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  float v = -FLT_MAX;
  int idx = INT32_MAX;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (row[i] > v || idx == INT32_MAX) {  // first element seeds the search; NaN never wins
      if (!(row[i] != row[i])) { v = row[i]; idx = i; }
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, o);
    const int oi = __shfl_xor_sync(kFullMask, idx, o);
    if (before(ov, oi, v, idx)) { v = ov; idx = oi; }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) { best_v[threadIdx.x >> 5] = v; best_i[threadIdx.x >> 5] = idx; }
  __syncthreads();
  if (threadIdx.x < 32) {
    const bool have = threadIdx.x < (blockDim.x >> 5);
    v = have ? best_v[threadIdx.x] : -FLT_MAX;
    idx = have ? best_i[threadIdx.x] : INT32_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, v, o);
      const int oi = __shfl_xor_sync(kFullMask, idx, o);
      if (before(ov, oi, v, idx)) { v = ov; idx = oi; }
    }
    if (threadIdx.x == 0) best_i[0] = idx;
  }
  __syncthreads();
  return best_i[0];
}

__global__ void __launch_bounds__(kThreads) greedy_kernel(int32_t* out, const float* logits, int vocab) {
  pdl_sync();
  const int idx = block_argmax(logits + static_cast<size_t>(blockIdx.x) * vocab, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

// One block per row: radix-select the K-th largest key (4 passes of 8 bits), ordered compaction
// of the K candidates, bitonic sort, softmax + scan, top-p cut, draw.
__global__ void __launch_bounds__(kThreads) top_k_top_p_kernel(SamplingParams p) {
  pdl_sync();
  __shared__ int hist[256];
  __shared__ float cand_v[kSamplingMaxK];
  __shared__ int cand_i[kSamplingMaxK];
  __shared__ float fscratch[32];
  __shared__ int iscratch[32];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_pick;
  __shared__ float s_kept_mass;

  const int b = blockIdx.x, tid = threadIdx.x;
  const float* row = p.logits + static_cast<size_t>(b) * p.vocab;
  const float temp = p.temperature[b];
  if (!(temp > 0.f)) {
    const int idx = block_argmax(row, p.vocab);
    if (tid == 0) p.out_tokens[b] = idx;
    return;
  }
  int k = p.top_k[b];
  if (k <= 0 || k > kSamplingMaxK) k = kSamplingMaxK;
  if (k > p.vocab) k = p.vocab;

  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < 256) hist[tid] = 0;
    __syncthreads();
    for (int i = tid; i < p.vocab; i += blockDim.x) {
      const uint32_t key = order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int cum = 0;
      for (int d = 255; d >= 0; --d) {
        if (cum + hist[d] >= remaining) {
          s_prefix = prefix | (static_cast<uint32_t>(d) << shift);
          s_remaining = remaining - cum;
          break;
        }
        cum += hist[d];
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  const uint32_t tau = prefix;        // key of the k-th largest logit
  const int need_eq = remaining;      // how many logits equal to it are taken (lowest ids)
  const int n_gt = k - need_eq;

  // Ordered compaction: greater-than-tau in id order, then the first need_eq equal ones.
  int base_gt = 0, base_eq = 0;
  for (int start = 0; start < p.vocab; start += blockDim.x) {
    const int i = start + tid;
    const uint32_t key = i < p.vocab ? order_key(row[i]) : 0u;
    const int gt = i < p.vocab && key > tau;
    const int eq = i < p.vocab && key == tau;
    if (__syncthreads_count(gt | eq) == 0) continue;  // most chunks hold no candidate
    int total;
    const int packed = gt | (eq << 16);  // both counts <= 1024 per chunk: 16 bits each
    const int incl = block_inclusive_scan<int>(packed, iscratch, &total);
    const int r_gt = (incl & 0xffff) - gt, r_eq = (incl >> 16) - eq;
    if (gt) { cand_v[base_gt + r_gt] = row[i]; cand_i[base_gt + r_gt] = i; }
    if (eq && base_eq + r_eq < need_eq) { cand_v[n_gt + base_eq + r_eq] = row[i]; cand_i[n_gt + base_eq + r_eq] = i; }
    base_gt += total & 0xffff;
    base_eq += total >> 16;
  }
  if (tid >= k) { cand_v[tid] = -FLT_MAX; cand_i[tid] = INT32_MAX; }
  __syncthreads();

  // Bitonic sort, best first.
  for (int size = 2; size <= kSamplingMaxK; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int partner = tid ^ stride;
      if (partner > tid) {
        const bool asc = (tid & size) == 0;  // this half keeps best-first order
        const float av = cand_v[tid], bv = cand_v[partner];
        const int ai = cand_i[tid], bi = cand_i[partner];
        if (asc ? before(bv, bi, av, ai) : before(av, ai, bv, bi)) {
          cand_v[tid] = bv; cand_i[tid] = bi;
          cand_v[partner] = av; cand_i[partner] = ai;
        }
      }
      __syncthreads();
    }
  }

  const float prob = tid < k ? expf((cand_v[tid] - cand_v[0]) / temp) : 0.f;
  float mass;
  const float cum = block_inclusive_scan<float>(prob, fscratch, &mass);
  const bool keep = tid < k && (tid == 0 || cum - prob < p.top_p[b] * mass);
  const int n_keep = __syncthreads_count(keep);  // keep is a prefix of the sorted candidates
  if (tid == n_keep - 1) {
    s_kept_mass = cum;
    s_pick = n_keep - 1;  // fallback if rounding puts the draw at the very end
  }
  __syncthreads();
  const float u = uniform01(p.seeds[b], p.steps[b]) * s_kept_mass;
  if (tid < n_keep && cum > u && cum - prob <= u) atomicMin(&s_pick, tid);
  __syncthreads();
  if (tid == 0) p.out_tokens[b] = cand_i[s_pick];
}

}  // namespace

void sample_greedy(int32_t* out, const float* logits, int batch, int vocab, cudaStream_t stream) {
  MB_CHECK(batch >= 0 && vocab > 0, "sample_greedy: bad shape");
  if (batch == 0) return;
  launch_dependent(greedy_kernel, batch, kThreads, 0, stream, out, logits, vocab);
  CUDA_CHECK_LAST();
}

void sample_top_k_top_p(const SamplingParams& p, cudaStream_t stream) {
  MB_CHECK(p.batch >= 0 && p.vocab > 0, "sample_top_k_top_p: bad shape");
  MB_CHECK(p.out_tokens && p.logits && p.temperature && p.top_k && p.top_p && p.seeds && p.steps,
           "sample_top_k_top_p: null operand");
  if (p.batch == 0) return;
  launch_dependent(top_k_top_p_kernel, p.batch, kThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
