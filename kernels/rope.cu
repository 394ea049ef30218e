#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope_device.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kWarps = 8;             // heads per block: they share the tokens' cos / sin tables
constexpr int kTokens = 4;            // tokens per block: each warp has 4 heads' loads in flight
constexpr int kMaxPairsPerLane = 4;  // rotary_dim <= 256
constexpr int kMaxTailPerLane = 8;   // head_dim - rotary_dim <= 256

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
  if (p.trigger_early) pdl_trigger_early();
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

// The wide form (kernels/rope_device.cuh), for heads of 16 · 2^j dims whose rotated half is
// whole 8-dim chunks (Qwen3's 128, Qwen3-Next's 256 with 64 rotating) and 16-byte aligned rows:
// a group of kG = head_dim / 8 lanes takes kU consecutive heads of one token, each lane 8
// consecutive dims of every head in one 16-byte access. Everything a group needs — its heads'
// rows, the token's slot, its (cos, sin) and both norms' weights for its 8 dims — is loaded in
// one round before anything waits, and the (cos, sin) and weights serve all kU heads. kU = 1 for
// a decode step's few tokens (latency: one head per group), more at prefill sizes, where bytes
// in flight decide (the warp-per-head kernel above moved 4-byte pairs and measured 2.7x its bytes
// at 8192 tokens). A group's lanes always take the same path (its shuffles are masked to it).
constexpr int kWideThreads = 256;

template <int kG, int kU>
__global__ void __launch_bounds__(kWideThreads) qk_norm_rope_wide_kernel(QkNormRopeParams p) {
  if (p.trigger_early) pdl_trigger_early();
  const bool write_cache = p.k_cache != nullptr;
  const int rotated = p.n_q_heads + p.n_kv_heads;
  const int heads = rotated + (write_cache ? p.n_kv_heads : 0);
  const int chunks = (heads + kU - 1) / kU;  // groups per token
  const int64_t group = (static_cast<int64_t>(blockIdx.x) * kWideThreads + threadIdx.x) / kG;
  if (group >= static_cast<int64_t>(p.tokens) * chunks) return;
  const int t = static_cast<int>(group / chunks), h0 = static_cast<int>(group % chunks) * kU;
  const RopeLane lane = rope_lane<kG>(rope_rotated_dims(p.rotary_dim, p.head_dim));
  const int d0 = 8 * lane.lane;

  // One round of loads. The slot, (cos, sin) and norm weights first, under the kernel before
  // (the qkv projection): step inputs, the forward's rotation table and weights, none written by
  // that kernel or the one before it (kernels/launch.cuh, the contract's exceptions); then the
  // heads' rows, its output.
  const int slot = write_cache && h0 + kU > p.n_q_heads ? p.slot_mapping[t] : -1;
  float2 cs[8];
  if (lane.rotates && h0 < rotated) rope_lane_rotation(p, t, lane, cs);
  const bool norms = p.q_norm != nullptr;
  float qw[8], kw[8];
  if (norms && h0 < p.n_q_heads) load8(p.q_norm + d0, qw);
  if (norms && h0 + kU > p.n_q_heads && h0 < rotated) load8(p.k_norm + d0, kw);
  pdl_sync();
  uint4 raw[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int h = h0 + u;
    const bf16* src = h >= heads            ? nullptr
                    : h < p.n_q_heads       ? p.q + t * p.q_stride + static_cast<int64_t>(h) * p.head_dim
                    : h < rotated           ? p.k + t * p.k_stride + static_cast<int64_t>(h - p.n_q_heads) * p.head_dim
                                            : p.v + t * p.v_stride + static_cast<int64_t>(h - rotated) * p.head_dim;
    raw[u] = src != nullptr ? *reinterpret_cast<const uint4*>(src + d0) : make_uint4(0, 0, 0, 0);
  }
  STEP_TRACE_MARK_IF(blockIdx.x == 0 && threadIdx.x == 0 && (raw[0].x | 1u) != 0u);  // rows in (diagnostic builds)

#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int h = h0 + u;
    if (h >= heads) break;  // the same for the whole group
    if (h >= rotated) {
      if (slot >= 0)  // a v head: a bit-exact copy into its slot
        *reinterpret_cast<uint4*>(p.v_cache + static_cast<size_t>(slot) * p.n_kv_heads * p.head_dim +
                                  static_cast<size_t>(h - rotated) * p.head_dim + d0) = raw[u];
      continue;
    }
    const bool is_q = h < p.n_q_heads;
    float x[8];
    unpack8(raw[u], x);
    norm_rope_lane<kG>(x, norms ? (is_q ? qw : kw) : nullptr, p, lane, cs);
    bf16* dst = is_q ? p.q + t * p.q_stride + static_cast<int64_t>(h) * p.head_dim
                     : p.k + t * p.k_stride + static_cast<int64_t>(h - p.n_q_heads) * p.head_dim;
    store8(dst + d0, x);
    if (!is_q && slot >= 0)  // size_t: slot * width overflows int for large pools
      store8(p.k_cache + static_cast<size_t>(slot) * p.n_kv_heads * p.head_dim +
                 static_cast<size_t>(h - p.n_q_heads) * p.head_dim + d0,
             x);
  }
  STEP_TRACE_MARK_IF(blockIdx.x == 0 && threadIdx.x == 0);  // rows stored
}

// Whether qk_norm_rope_wide_kernel takes these operands: heads of 16 · 2^j dims up to 256, a
// rotated half of whole 8-dim chunks, 16-byte aligned rows, weights and table.
bool wide_form_fits(const QkNormRopeParams& p) {
  const int d = p.head_dim, rd = rope_rotated_dims(p.rotary_dim, p.head_dim);
  const auto a16 = aligned16;
  return d >= 16 && d <= 256 && (d & (d - 1)) == 0 && rd % 16 == 0 && a16(p.q) && a16(p.k) &&
         p.q_stride % 8 == 0 && p.k_stride % 8 == 0 && (p.q_norm == nullptr || (a16(p.q_norm) && a16(p.k_norm))) &&
         (p.rotation == nullptr || a16(p.rotation)) &&
         (p.k_cache == nullptr || (a16(p.k_cache) && a16(p.v_cache) && a16(p.v) && p.v_stride % 8 == 0));
}

template <int kG>
void launch_wide(const QkNormRopeParams& p, cudaStream_t stream) {
  const int heads = p.n_q_heads + p.n_kv_heads + (p.k_cache ? p.n_kv_heads : 0);
  const int64_t items = static_cast<int64_t>(p.tokens) * heads;
  // Four heads per group once there are enough (token, head) items to fill the GPU several times
  // over (8192 tokens of the 30B shape: 73.6 us, against 102 with one head per group and 95.6 for
  // the warp-per-head form, H200); a decode step's few items each get their own lanes, latency
  // being its cost.
  auto blocks = [&](int u) {
    return static_cast<unsigned>(CEIL_DIV(static_cast<int64_t>(p.tokens) * CEIL_DIV(heads, u) * kG, kWideThreads));
  };
  if (items >= 8192) {
    launch_dependent(qk_norm_rope_wide_kernel<kG, 4>, dim3(blocks(4)), kWideThreads, 0, stream, p);
  } else {
    launch_dependent(qk_norm_rope_wide_kernel<kG, 1>, dim3(blocks(1)), kWideThreads, 0, stream, p);
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
  if (wide_form_fits(p)) {
    switch (p.head_dim / 8) {
      case 2: launch_wide<2>(p, stream); break;
      case 4: launch_wide<4>(p, stream); break;
      case 8: launch_wide<8>(p, stream); break;
      case 16: launch_wide<16>(p, stream); break;
      default: launch_wide<32>(p, stream); break;
    }
    CUDA_CHECK_LAST();
    return;
  }
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
