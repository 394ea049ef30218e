#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 8;             // heads per block: they share the tokens' cos / sin tables
constexpr int kTokens = 4;            // tokens per block: each warp has 4 heads' loads in flight
constexpr int kMaxPairsPerLane = 4;  // rotary_dim <= 256
constexpr int kMaxTailPerLane = 8;   // head_dim - rotary_dim <= 256

// (cos, sin) of pair i at `position`: the fp32 angle as the reference implementation computes
// it, and the precise sincosf, since the angle grows to ~1e5 radians at long positions (it costs
// more than the rest of qk_norm_rope, hence the table a forward computes once for all layers).
__device__ __forceinline__ float2 rope_rotation(int position, int i, int rd, float theta) {
  const float inv_freq = 1.f / powf(theta, static_cast<float>(2 * i) / rd);
  float sn, co;
  sincosf(static_cast<float>(position) * inv_freq, &sn, &co);
  return make_float2(co, sn);
}

__global__ void rope_rotation_table_kernel(const int32_t* positions, int tokens, int rd, float theta,
                                           float2* table) {
  pdl_sync();
  const int half = rd / 2;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= static_cast<int64_t>(tokens) * half) return;
  const int t = static_cast<int>(e / half), i = static_cast<int>(e % half);
  table[e] = rope_rotation(positions[t], i, rd, theta);
}

__device__ __forceinline__ void load2(const bf16* at, float& lo, float& hi) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
  lo = f.x;
  hi = f.y;
}
__device__ __forceinline__ void store2(bf16* at, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(lo, hi);
}

// One warp per head, for the block's kTokens tokens. With a cache, heads n_q + n_kv ..
// n_q + 2 n_kv are the v heads, copied to the cache slot unchanged. Why this shape: the kernel
// moves ~20 KB per token and does little arithmetic, so it is bound by the latency of its loads;
// each warp issues all its tokens' loads before anything waits, and the block's cos / sin per
// (token, pair) go into shared memory meanwhile (from the forward's table when given).
// kPairs / kTail: registers a lane holds per token of the rotated half (2: rotary_dim ≤ 128) and
// of the unrotated tail (0: the whole head rotates), so that Qwen3's heads of 128 keep few
// registers and many warps per SM.
template <int kPairs, int kTail>
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_kernel(QkNormRopeParams p) {
  pdl_sync();
  __shared__ float2 rotation[kTokens][32 * kMaxPairsPerLane];  // (cos, sin) of pair i
  const int t0 = blockIdx.y * kTokens;
  const int head = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const bool write_cache = p.k_cache != nullptr;
  const int rotated = p.n_q_heads + p.n_kv_heads;
  const int rd = rope_rotated_dims(p.rotary_dim, p.head_dim);
  const int half = rd / 2, pass = p.head_dim - rd;
  const int n_tok = min(kTokens, p.tokens - t0);
  int slot[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j) slot[j] = write_cache && j < n_tok ? p.slot_mapping[t0 + j] : -1;

  if (head >= rotated && head < rotated + (write_cache ? p.n_kv_heads : 0)) {
    // v heads: bit-exact copies into the cache slots, 4-byte pairs, every token's load first
    const int kvh = head - rotated;
    for (int i = 2 * lane; i < p.head_dim; i += 64) {
      __nv_bfloat162 v[kTokens];
#pragma unroll
      for (int j = 0; j < kTokens; ++j)
        if (slot[j] >= 0)
          v[j] = *reinterpret_cast<const __nv_bfloat162*>(p.v + (t0 + j) * p.v_stride +
                                                          static_cast<int64_t>(kvh) * p.head_dim + i);
#pragma unroll
      for (int j = 0; j < kTokens; ++j)
        if (slot[j] >= 0)
          *reinterpret_cast<__nv_bfloat162*>(p.v_cache + static_cast<size_t>(slot[j]) * p.n_kv_heads * p.head_dim +
                                             static_cast<size_t>(kvh) * p.head_dim + i) = v[j];
    }
  }
  const bool is_qk = head < rotated, is_q = head < p.n_q_heads;
  // Lane owns the element pairs (i, i + 1) at i = 2·lane + 64·jj of the rotated half (each with
  // its partner i + half) and of the unrotated tail rd + i: 4-byte accesses.
  bf16* x[kTokens];
  float a[kTokens][kPairs], b[kTokens][kPairs], c[kTokens][kTail > 0 ? kTail : 1];
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    const int t = t0 + j;
    x[j] = !is_qk || j >= n_tok ? nullptr
         : is_q                 ? p.q + t * p.q_stride + static_cast<int64_t>(head) * p.head_dim
                                : p.k + t * p.k_stride + static_cast<int64_t>(head - p.n_q_heads) * p.head_dim;
#pragma unroll
    for (int jj = 0; jj < kPairs / 2; ++jj) {
      const int i = 2 * lane + 64 * jj;
      a[j][2 * jj] = a[j][2 * jj + 1] = b[j][2 * jj] = b[j][2 * jj + 1] = 0.f;
      if (x[j] != nullptr && i < half) {
        load2(x[j] + i, a[j][2 * jj], a[j][2 * jj + 1]);
        load2(x[j] + i + half, b[j][2 * jj], b[j][2 * jj + 1]);
      }
    }
#pragma unroll
    for (int jj = 0; jj < kTail / 2; ++jj) {
      const int i = 2 * lane + 64 * jj;
      c[j][2 * jj] = c[j][2 * jj + 1] = 0.f;
      if (x[j] != nullptr && i < pass) load2(x[j] + rd + i, c[j][2 * jj], c[j][2 * jj + 1]);
    }
  }
  if (blockIdx.x * kWarps < rotated) {  // the block has q or k heads
    for (int e = threadIdx.x; e < n_tok * half; e += blockDim.x) {
      const int j = e / half, i = e % half;
      rotation[j][i] = p.rotation != nullptr ? p.rotation[static_cast<size_t>(t0 + j) * half + i]
                                             : rope_rotation(p.positions[t0 + j], i, rd, p.theta);
    }
    __syncthreads();
  }
  if (!is_qk) return;
  const bf16* w = is_q ? p.q_norm : p.k_norm;
  auto weight = [&](int i) { return w != nullptr ? p.norm_offset + __bfloat162float(w[i]) : 1.f; };
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    if (j >= n_tok) break;
    // size_t: slot * width overflows int for large pools.
    bf16* kc = !is_q && slot[j] >= 0 ? p.k_cache + static_cast<size_t>(slot[j]) * p.n_kv_heads * p.head_dim +
                                           static_cast<size_t>(head - p.n_q_heads) * p.head_dim
                                     : nullptr;
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < kPairs; ++e) ss += a[j][e] * a[j][e] + b[j][e] * b[j][e];
#pragma unroll
    for (int e = 0; e < kTail; ++e) ss += c[j][e] * c[j][e];
    const float rstd = w != nullptr ? rsqrtf(warp_sum(ss) / p.head_dim + p.eps) : 1.f;
#pragma unroll
    for (int jj = 0; jj < kPairs / 2; ++jj) {
      const int i = 2 * lane + 64 * jj;
      if (i >= half) continue;
      float ra[2], rb[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float xa = a[j][2 * jj + e] * rstd * weight(i + e), xb = b[j][2 * jj + e] * rstd * weight(i + e + half);
        const float co = rotation[j][i + e].x, sn = rotation[j][i + e].y;
        ra[e] = xa * co - xb * sn;
        rb[e] = xb * co + xa * sn;
      }
      store2(x[j] + i, ra[0], ra[1]);
      store2(x[j] + i + half, rb[0], rb[1]);
      if (kc != nullptr) {
        store2(kc + i, ra[0], ra[1]);
        store2(kc + i + half, rb[0], rb[1]);
      }
    }
#pragma unroll
    for (int jj = 0; jj < kTail / 2; ++jj) {
      const int i = 2 * lane + 64 * jj;
      if (i >= pass) continue;
      const float r0 = c[j][2 * jj] * rstd * weight(rd + i), r1 = c[j][2 * jj + 1] * rstd * weight(rd + i + 1);
      store2(x[j] + rd + i, r0, r1);
      if (kc != nullptr) store2(kc + rd + i, r0, r1);
    }
  }
}

}  // namespace

void rope_rotation_table(const int32_t* positions, int tokens, int rotary_dim, float theta, float2* table,
                         cudaStream_t stream) {
  MB_CHECK(rotary_dim > 0 && rotary_dim % 4 == 0 && rotary_dim <= 64 * kMaxPairsPerLane,
           "rope_rotation_table: rotary_dim must be a positive multiple of 4, <= 256");
  MB_CHECK(tokens >= 0 && (tokens == 0 || (positions && table)), "rope_rotation_table: null operand");
  if (tokens == 0) return;
  constexpr int kThreads = 256;
  const int64_t n = static_cast<int64_t>(tokens) * (rotary_dim / 2);
  launch_dependent(rope_rotation_table_kernel, dim3(static_cast<unsigned>(CEIL_DIV(n, kThreads))), kThreads, 0,
                   stream, positions, tokens, rotary_dim, theta, table);
  CUDA_CHECK_LAST();
}

void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream) {
  MB_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 64 * kMaxPairsPerLane,
           "qk_norm_rope: head_dim must be even and <= 256");
  MB_CHECK(p.rotary_dim >= 0 && p.rotary_dim % 4 == 0 && p.rotary_dim <= p.head_dim && p.head_dim % 4 == 0,
           "qk_norm_rope: head_dim and rotary_dim must be multiples of 4, rotary_dim <= head_dim");
  // 4-byte element pairs: every head starts at an even element of a 4-byte aligned buffer
  MB_CHECK(p.q_stride % 2 == 0 && p.k_stride % 2 == 0 && reinterpret_cast<uintptr_t>(p.q) % 4 == 0 &&
               reinterpret_cast<uintptr_t>(p.k) % 4 == 0 &&
               (p.k_cache == nullptr ||
                (reinterpret_cast<uintptr_t>(p.k_cache) % 4 == 0 && reinterpret_cast<uintptr_t>(p.v_cache) % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(p.v) % 4 == 0 && p.v_stride % 2 == 0)),
           "qk_norm_rope: q, k, v and the cache must be 4-byte aligned with even strides");
  MB_CHECK(p.q && p.k && p.positions, "qk_norm_rope: null operand");
  MB_CHECK(p.q_stride >= static_cast<int64_t>(p.n_q_heads) * p.head_dim &&
               p.k_stride >= static_cast<int64_t>(p.n_kv_heads) * p.head_dim,
           "qk_norm_rope: stride smaller than the heads it holds");
  MB_CHECK((p.q_norm == nullptr) == (p.k_norm == nullptr), "qk_norm_rope: give both norms or none");
  MB_CHECK(p.k_cache == nullptr || (p.v_cache && p.v && p.slot_mapping &&
                                     p.v_stride >= static_cast<int64_t>(p.n_kv_heads) * p.head_dim),
           "qk_norm_rope: a cache write needs v_cache, v, v_stride and slot_mapping");
  if (p.tokens == 0) return;
  MB_CHECK(CEIL_DIV(p.tokens, kTokens) <= 65535, "qk_norm_rope: tokens exceed grid.y");
  const int heads = p.n_q_heads + p.n_kv_heads + (p.k_cache ? p.n_kv_heads : 0);
  const dim3 grid(CEIL_DIV(heads, kWarps), CEIL_DIV(p.tokens, kTokens));
  const int rd = rope_rotated_dims(p.rotary_dim, p.head_dim);
  const bool short_half = rd <= 128, no_tail = rd == p.head_dim;
  if (short_half && no_tail)
    launch_dependent(qk_norm_rope_kernel<2, 0>, grid, kWarps * 32, 0, stream, p);
  else if (short_half)
    launch_dependent(qk_norm_rope_kernel<2, kMaxTailPerLane>, grid, kWarps * 32, 0, stream, p);
  else if (no_tail)
    launch_dependent(qk_norm_rope_kernel<kMaxPairsPerLane, 0>, grid, kWarps * 32, 0, stream, p);
  else
    launch_dependent(qk_norm_rope_kernel<kMaxPairsPerLane, kMaxTailPerLane>, grid, kWarps * 32, 0,
                     stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
