// Device side of qk_norm_rope's wide form (kernels/rope.cu), for any kernel that normalises and
// rotates heads as it does: a group of kG = head_dim / 8 lanes holds one head of one token, each
// lane 8 consecutive dims [8·lane, 8·lane + 8) in fp32. The rotation partner of dim i (i ± rd / 2)
// sits in another lane of the group; rd / 2 must be a multiple of 8 (whole lanes rotate).
// Included only from .cu files.
#pragma once

#include "kernels/device_common.cuh"
#include "kernels/rope.cuh"

namespace moebatch::kernels {

// (cos, sin) of pair i at `position`: the fp32 angle as the reference implementation computes
// it, and the precise sincosf, since the angle grows to ~1e5 radians at long positions (it costs
// more than the rest of qk_norm_rope, hence the table a forward computes once for all layers).
__device__ __forceinline__ float2 rope_rotation(int position, int i, int rd, float theta) {
  const float inv_freq = 1.f / powf(theta, static_cast<float>(2 * i) / rd);
  float sn, co;
  sincosf(static_cast<float>(position) * inv_freq, &sn, &co);
  return make_float2(co, sn);
}

/// A lane's place in its group: which 8 dims it holds and how they rotate.
struct RopeLane {
  int lane;       ///< within the group: dims [8·lane, 8·lane + 8)
  int partner;    ///< the lane holding dims i ± rd / 2 (itself in the unrotated tail)
  int pair0;      ///< first rotation pair of the lane's dims
  bool rotates;   ///< dims below rd
  float sign;     ///< −1 for the first half (a·cos − b·sin), +1 for the second (b·cos + a·sin)
  unsigned mask;  ///< the group's lanes, for its shuffles
};

template <int kG>
__device__ __forceinline__ RopeLane rope_lane(int rd) {
  static_assert(kG >= 2 && kG <= 32 && (kG & (kG - 1)) == 0, "lanes per head: a power of two within a warp");
  RopeLane l;
  l.lane = static_cast<int>(threadIdx.x) % kG;
  const int half_lanes = rd / 16;
  l.rotates = l.lane < 2 * half_lanes;
  l.partner = l.lane < half_lanes ? l.lane + half_lanes : l.rotates ? l.lane - half_lanes : l.lane;
  l.pair0 = 8 * (l.lane < half_lanes ? l.lane : l.lane - half_lanes);
  l.sign = l.lane < half_lanes ? -1.f : 1.f;
  l.mask = kG == 32 ? kFullMask : ((1u << kG) - 1) << (threadIdx.x % 32 / kG * kG);
  return l;
}

/// (cos, sin) of the lane's 8 pairs for token t: from the forward's table when given, else
/// computed. Only lanes that rotate call it.
__device__ __forceinline__ void rope_lane_rotation(const QkNormRopeParams& p, int t, const RopeLane& l,
                                                   float2 (&cs)[8]) {
  const int rd = rope_rotated_dims(p.rotary_dim, p.head_dim), half = rd / 2;
  if (p.rotation != nullptr) {
    const float4* row = reinterpret_cast<const float4*>(p.rotation + static_cast<size_t>(t) * half + l.pair0);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float4 v = row[e];
      cs[2 * e] = make_float2(v.x, v.y);
      cs[2 * e + 1] = make_float2(v.z, v.w);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) cs[e] = rope_rotation(p.positions[t], l.pair0 + e, rd, p.theta);
  }
}

// The arithmetic of a head's norm and rotation, one place for qk_norm_rope's wide form and the
// prefill attention's q rotated as it loads (kernels/attention_wgmma.cu), with the roundings
// spelled out so that both compute the same bits whatever the compiler would contract. A head's
// sum of squares is the 8-dim chunks' sums (rope_sum_squares8) added as a butterfly over chunks
// 8, 4, 2, 1 apart (commutative, so every holder gets the same value).
__device__ __forceinline__ float rope_sum_squares8(const float (&x)[8]) {
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = __fmaf_rn(x[e], x[e], ss);
  return ss;
}
__device__ __forceinline__ float rope_rstd(float ss, int head_dim, float eps) { return rsqrtf(ss / head_dim + eps); }
/// x · rstd · (offset + w)
__device__ __forceinline__ float rope_normed(float x, float rstd, float offset, float w) {
  return __fmul_rn(__fmul_rn(x, rstd), __fadd_rn(offset, w));
}
/// Dim i of a rotated pair (i, i ± rd / 2) with partner y: sign −1 for the first half
/// (x·cos − y·sin), +1 for the second (x·cos + y·sin).
__device__ __forceinline__ float rope_rotated(float x, float y, float2 cs, float sign) {
  return __fmaf_rn(x, cs.x, sign * __fmul_rn(y, cs.y));
}

/// Normalises (w: the lane's 8 norm weights, nullptr for none) and rotates the lane's 8 dims of
/// one head in place. Every lane of the group calls it (shuffles); cs is read only where the
/// lane rotates.
template <int kG>
__device__ __forceinline__ void norm_rope_lane(float (&x)[8], const float* w, const QkNormRopeParams& p,
                                               const RopeLane& l, const float2 (&cs)[8]) {
  if (w != nullptr) {
    float ss = rope_sum_squares8(x);
#pragma unroll
    for (int o = kG / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(l.mask, ss, o, kG);
    const float rstd = rope_rstd(ss, p.head_dim, p.eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = rope_normed(x[e], rstd, p.norm_offset, w[e]);
  }
  float y[8];  // the partner lane's dims, normalised
#pragma unroll
  for (int e = 0; e < 8; ++e) y[e] = __shfl_sync(l.mask, x[e], l.partner, kG);
  if (l.rotates) {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = rope_rotated(x[e], y[e], cs[e], l.sign);
  }
}

}  // namespace moebatch::kernels
