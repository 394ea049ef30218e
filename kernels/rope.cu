#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/rope.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 8;             // heads per block: they share the token's cos / sin table
constexpr int kMaxPairsPerLane = 4;  // rotary_dim <= 256
constexpr int kMaxTailPerLane = 8;   // head_dim - rotary_dim <= 256

// One warp per (token, head); lane owns rotation pairs i = lane + 32*j. With a cache, heads
// n_q + n_kv .. n_q + 2 n_kv are the v heads, copied to the cache slot unchanged. The block's
// heads share one token, so its cos / sin per pair are computed once into shared memory (the
// precise sincosf of angles up to ~1e5 radians costs more than the rest of the kernel).
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_kernel(QkNormRopeParams p) {
  __shared__ float2 rotation[32 * kMaxPairsPerLane];  // (cos, sin) of pair i
  const int t = blockIdx.y;
  const int head = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const bool write_cache = p.k_cache != nullptr;
  const int rotated = p.n_q_heads + p.n_kv_heads;
  const int rd = p.rotary_dim > 0 ? p.rotary_dim : p.head_dim;
  const int half = rd / 2, pass = p.head_dim - rd;
  if (blockIdx.x * kWarps < rotated) {
    const float pos = static_cast<float>(p.positions[t]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      // fp32 angle as the reference implementation computes it; precise sincosf, since the
      // angle grows to ~1e5 radians at long positions.
      const float inv_freq = 1.f / powf(p.theta, static_cast<float>(2 * i) / rd);
      float sn, co;
      sincosf(pos * inv_freq, &sn, &co);
      rotation[i] = make_float2(co, sn);
    }
    __syncthreads();
  }
  if (head >= rotated + (write_cache ? p.n_kv_heads : 0)) return;
  const int slot = write_cache ? p.slot_mapping[t] : -1;
  // size_t: slot * width overflows int for large pools.
  const size_t cache_head = static_cast<size_t>(slot) * p.n_kv_heads * p.head_dim +
                            static_cast<size_t>(head - p.n_q_heads) * p.head_dim;
  if (head >= rotated) {
    if (slot < 0) return;
    const int kvh = head - rotated;
    const bf16* src = p.v + t * p.v_stride + static_cast<int64_t>(kvh) * p.head_dim;
    bf16* dst = p.v_cache + static_cast<size_t>(slot) * p.n_kv_heads * p.head_dim +
                static_cast<size_t>(kvh) * p.head_dim;
    for (int i = lane; i < p.head_dim; i += 32) dst[i] = src[i];
    return;
  }
  const bool is_q = head < p.n_q_heads;
  bf16* kc = !is_q && slot >= 0 ? p.k_cache + cache_head : nullptr;
  bf16* x = is_q ? p.q + t * p.q_stride + static_cast<int64_t>(head) * p.head_dim
                 : p.k + t * p.k_stride + static_cast<int64_t>(head - p.n_q_heads) * p.head_dim;
  const bf16* w = is_q ? p.q_norm : p.k_norm;

  // Lane owns the element pairs (i, i + 1) at i = 2·lane + 64·j of the rotated half (each with
  // its partner i + half) and of the unrotated tail rd + i: 4-byte accesses.
  float a[kMaxPairsPerLane], b[kMaxPairsPerLane], c[kMaxTailPerLane];
  float ss = 0.f;
  auto load2 = [](const bf16* at, float& lo, float& hi) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
    lo = f.x;
    hi = f.y;
  };
  auto store2 = [](bf16* at, float lo, float hi) {
    *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(lo, hi);
  };
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane / 2; ++j) {
    const int i = 2 * lane + 64 * j;
    a[2 * j] = a[2 * j + 1] = b[2 * j] = b[2 * j + 1] = 0.f;
    if (i < half) {
      load2(x + i, a[2 * j], a[2 * j + 1]);
      load2(x + i + half, b[2 * j], b[2 * j + 1]);
    }
    ss += a[2 * j] * a[2 * j] + a[2 * j + 1] * a[2 * j + 1] + b[2 * j] * b[2 * j] + b[2 * j + 1] * b[2 * j + 1];
  }
#pragma unroll
  for (int j = 0; j < kMaxTailPerLane / 2; ++j) {
    const int i = 2 * lane + 64 * j;
    c[2 * j] = c[2 * j + 1] = 0.f;
    if (i < pass) load2(x + rd + i, c[2 * j], c[2 * j + 1]);
    ss += c[2 * j] * c[2 * j] + c[2 * j + 1] * c[2 * j + 1];
  }
  float rstd = 1.f;
  if (w != nullptr) rstd = rsqrtf(warp_sum(ss) / p.head_dim + p.eps);
  auto weight = [&](int i) { return w != nullptr ? p.norm_offset + __bfloat162float(w[i]) : 1.f; };
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane / 2; ++j) {
    const int i = 2 * lane + 64 * j;
    if (i >= half) continue;
    float ra[2], rb[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float xa = a[2 * j + e] * rstd * weight(i + e), xb = b[2 * j + e] * rstd * weight(i + e + half);
      const float co = rotation[i + e].x, sn = rotation[i + e].y;
      ra[e] = xa * co - xb * sn;
      rb[e] = xb * co + xa * sn;
    }
    store2(x + i, ra[0], ra[1]);
    store2(x + i + half, rb[0], rb[1]);
    if (kc != nullptr) {
      store2(kc + i, ra[0], ra[1]);
      store2(kc + i + half, rb[0], rb[1]);
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxTailPerLane / 2; ++j) {
    const int i = 2 * lane + 64 * j;
    if (i >= pass) continue;
    const float r0 = c[2 * j] * rstd * weight(rd + i), r1 = c[2 * j + 1] * rstd * weight(rd + i + 1);
    store2(x + rd + i, r0, r1);
    if (kc != nullptr) store2(kc + rd + i, r0, r1);
  }
}

}  // namespace

void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream) {
  MB_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= 64 * kMaxPairsPerLane,
           "qk_norm_rope: head_dim must be even and <= 256");
  MB_CHECK(p.rotary_dim >= 0 && p.rotary_dim % 4 == 0 && p.rotary_dim <= p.head_dim && p.head_dim % 4 == 0,
           "qk_norm_rope: head_dim and rotary_dim must be multiples of 4, rotary_dim <= head_dim");
  // 4-byte element pairs: every head starts at an even element of a 4-byte aligned buffer
  MB_CHECK(p.q_stride % 2 == 0 && p.k_stride % 2 == 0 && reinterpret_cast<uintptr_t>(p.q) % 4 == 0 &&
               reinterpret_cast<uintptr_t>(p.k) % 4 == 0 &&
               (p.k_cache == nullptr || reinterpret_cast<uintptr_t>(p.k_cache) % 4 == 0),
           "qk_norm_rope: q, k and the cache must be 4-byte aligned with even strides");
  MB_CHECK(p.q && p.k && p.positions, "qk_norm_rope: null operand");
  MB_CHECK(p.q_stride >= static_cast<int64_t>(p.n_q_heads) * p.head_dim &&
               p.k_stride >= static_cast<int64_t>(p.n_kv_heads) * p.head_dim,
           "qk_norm_rope: stride smaller than the heads it holds");
  MB_CHECK((p.q_norm == nullptr) == (p.k_norm == nullptr), "qk_norm_rope: give both norms or none");
  MB_CHECK(p.k_cache == nullptr || (p.v_cache && p.v && p.slot_mapping &&
                                     p.v_stride >= static_cast<int64_t>(p.n_kv_heads) * p.head_dim),
           "qk_norm_rope: a cache write needs v_cache, v, v_stride and slot_mapping");
  if (p.tokens == 0) return;
  MB_CHECK(p.tokens <= 65535, "qk_norm_rope: tokens exceed grid.y");
  const int heads = p.n_q_heads + p.n_kv_heads + (p.k_cache ? p.n_kv_heads : 0);
  const dim3 grid(CEIL_DIV(heads, kWarps), p.tokens);
  qk_norm_rope_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
