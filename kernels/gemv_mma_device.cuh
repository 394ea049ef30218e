// The decode GEMV's weight walk on tensor cores, device code only: one warp multiplies a tile of
// 16 weight rows with ≤ 8 activation rows on mma.m16n8k16 (bf16 operands, fp32 accumulators).
// For the 4-bit codecs: on CUDA cores (kernels/gemv_device.cuh) decoding a code, converting it
// and its activation to fp32 and one FMA take ~8 instructions a weight; here the FMAs and
// conversions become one mma per 8 weights a lane, and what is left is the decode into bf16.
// Measured (bench/RESULTS.md, session 20): Int4 steps −5% at batch 1, NVFP4 unchanged (its
// one-token GEMVs are bound by their round trips, not by issue).
//
// Operands: the weight rows are A (tile row r = matrix row rows[r]), the activation rows the 8
// columns of B (column i = activation row i; columns past the rows a caller has are filled with
// any of them and not read). Lane L = 4q + t holds tile rows q and q + 8 (A's fragment rows) and
// column q of B; C's fragment gives it rows q, q + 8 at columns 2t, 2t + 1.
//
// Which inputs feed which k slot of an mma does not change the sum, as long as A and B agree.
// Lane t of a row quad walks granules g = 4j + t (16 bytes: 32 4-bit values), so the quad's four
// lanes read 64 contiguous bytes of each of their rows, and an mma's k slots 2t, 2t + 1, 2t + 8,
// 2t + 9 of lane t are four consecutive values of its own granule (A) and the same four
// activations (B: held by lanes with the same t). No shared memory, no shuffles: each lane's
// 16-byte loads decode in registers straight into A fragments.
//
// Codecs (gemv_mma_codec): Nvfp4 decodes exactly (code × E4M3 group scale fits bf16; the row
// scale is the caller's epilogue's, as on CUDA cores). Int4's group of 32 is one granule, but
// an mma sums four lanes' granules, four groups with their own scale and min, so the scale goes
// into A. As q·s − min = s·(q − 8) + (8·s − min), A = s·(q − 8) rounded once to bf16 (q − 8
// exact from the bf16 128 + q) and a second product adds the constant term: A = 8·s − min (bf16)
// over the granule's slots times the same B. Centred codes keep both terms near the weight's own
// size, so their roundings are of the order of the grouped GEMM's decode of each weight to bf16;
// q·s − min as two terms of about twice that size measured 1.1e-2 relative against 8.9e-3.
#pragma once

#include <cuda_bf16.h>

#include "kernels/gemv_device.cuh"
#include "kernels/mma.cuh"

namespace moebatch::kernels {

/// The codecs the tensor-core walk takes (their granules hold 32 values, scales inside one).
__host__ __device__ constexpr bool gemv_mma_codec(WeightCodec c) {
  return c == WeightCodec::Nvfp4 || c == WeightCodec::Int4;
}

/// Granule quads a lane has in flight at once: 4 × 2 rows × 16 bytes.
constexpr int kGemvMmaQuadsInFlight = 4;

#ifdef __CUDACC__

// Pair j (values 2j, 2j + 1) of eight 4-bit codes `w` as the bf16 pair 128 + code (exact: the
// bf16 128 has a mantissa step of 1), from the even codes `even` = w & 0x0f0f0f0f and the odd
// ones `odd` = (w >> 4) & 0x0f0f0f0f.
__device__ __forceinline__ unsigned u4_pair_plus128(unsigned even, unsigned odd, int j) {
  const unsigned r = __byte_perm(even, odd, static_cast<unsigned>(j | ((4 + j) << 8)));
  return (r & 0x000f000fu) | 0x43004300u;
}

__device__ __forceinline__ unsigned bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const unsigned*>(&v);
}
__device__ __forceinline__ __nv_bfloat162 bf16x2_of(unsigned u) {
  return *reinterpret_cast<const __nv_bfloat162*>(&u);
}

/// The scales of one granule of a lane's two rows: Nvfp4 the two E4M3 group scales (bytes of a
/// u16), Int4 the f32 scale and min of its one group.
struct MmaGranuleScales {
  unsigned gscale[2] = {0, 0};
  float scale[2] = {0.f, 0.f}, minv[2] = {0.f, 0.f};
};

/// c += this lane's granule of rows q (w[0]) and q + 8 (w[1]) times the 32 activations at `xg`
/// (nullptr: a granule past k, zeros) on 8 (Int4: 16) mmas. Every lane of the warp calls it.
template <WeightCodec C>
__device__ __forceinline__ void mma_granule(float (&c)[4], const uint4 (&w)[2], const MmaGranuleScales& sc,
                                            const bf16* xg) {
  constexpr int V = codec_granule(C);
  // Int4: w = s·(q − 8) + (8·s − min); the bf16 scale of each row and the bf16 constant term
  // (small where the min centres the codes, as Q4_K's do)
  __nv_bfloat162 s2[2];
  unsigned cterm[2];
  if constexpr (C == WeightCodec::Int4) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      s2[r] = __float2bfloat162_rn(sc.scale[r]);
      cterm[r] = bf16x2_bits(__float2bfloat162_rn(8.f * sc.scale[r] - sc.minv[r]));
    }
  }
  const __nv_bfloat162 k136 = __float2bfloat162_rn(136.f);
#pragma unroll
  for (int p = 0; p < V / 8; ++p) {  // 8-value pieces: word p of the granule
    const uint4 xv = xg ? __ldg(reinterpret_cast<const uint4*>(xg + 8 * p)) : make_uint4(0, 0, 0, 0);
    unsigned a[2][4];  // the piece's four bf16 pairs of each row
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (C == WeightCodec::Nvfp4) {
        const uint4 d = decode_fp4x8(word_of(w[r], p),
                                     fp4_group_scale(static_cast<unsigned char>(sc.gscale[r] >> (8 * (p / 2)))));
        a[r][0] = d.x, a[r][1] = d.y, a[r][2] = d.z, a[r][3] = d.w;
      } else {
        const unsigned code = word_of(w[r], p);
        const unsigned even = code & 0x0f0f0f0fu, odd = (code >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int q = 0; q < 4; ++q)  // (128 + q) − 136 = q − 8 exactly, times s rounded once
          a[r][q] = bf16x2_bits(__hmul2(__hsub2(bf16x2_of(u4_pair_plus128(even, odd, q)), k136), s2[r]));
      }
    }
    // pairs 0, 1 then 2, 3: A row q / q + 8 at k slots 2t.. and 2t + 8.., B the same values
    mma_bf16_16816(c, a[0][0], a[1][0], a[0][1], a[1][1], xv.x, xv.y);
    mma_bf16_16816(c, a[0][2], a[1][2], a[0][3], a[1][3], xv.z, xv.w);
    if constexpr (C == WeightCodec::Int4) {  // + (8·s − min) · Σ x over the same slots
      mma_bf16_16816(c, cterm[0], cterm[1], cterm[0], cterm[1], xv.x, xv.y);
      mma_bf16_16816(c, cterm[0], cterm[1], cterm[0], cterm[1], xv.z, xv.w);
    }
  }
}

/// c (this lane's C fragment, accumulated into) += the warp's share of rows rows[0] (tile row q)
/// and rows[1] (tile row q + 8) times activation row x (B column q) over granule quads quad0,
/// quad0 + quad_step, ... of k. Every lane of the warp must call it with the same quad0 and
/// quad_step. The first loads go out before pdl_sync (kernels/launch.cuh): the weights are
/// constants, x is the kernel before's output.
template <WeightCodec C>
__device__ __forceinline__ void gemv_tile_mma(const QuantMatrix& w, int k, const int (&rows)[2],
                                              const bf16* x, int quad0, int quad_step, float (&c)[4]) {
  static_assert(gemv_mma_codec(C), "4-bit codecs: 32 values a granule");
  constexpr int V = codec_granule(C);
  const int t = threadIdx.x & 3;
  const int granules = k / V;
  const int quads = (granules + 3) / 4;
  const size_t row_bytes = codec_row_bytes(C, k);
  const unsigned char* wrow[2];
  size_t srow[2];  // scale-row base: Nvfp4 u16 pairs, Int4 f32 (one group a granule)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    wrow[r] = static_cast<const unsigned char*>(w.data) + static_cast<size_t>(rows[r]) * row_bytes;
    srow[r] = static_cast<size_t>(rows[r]) * granules;
  }
  bool waited = false;
  for (int j0 = quad0; j0 < quads; j0 += kGemvMmaQuadsInFlight * quad_step) {  // warp-uniform
    uint4 wv[kGemvMmaQuadsInFlight][2];
    MmaGranuleScales sc[kGemvMmaQuadsInFlight];
#pragma unroll
    for (int u = 0; u < kGemvMmaQuadsInFlight; ++u) {
      const int g = 4 * (j0 + u * quad_step) + t;
      const bool live = j0 + u * quad_step < quads && g < granules;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        wv[u][r] = make_uint4(0, 0, 0, 0);
        if (live) {
          wv[u][r] = __ldcs(reinterpret_cast<const uint4*>(wrow[r] + static_cast<size_t>(g) * 16));
          if constexpr (C == WeightCodec::Nvfp4) {
            sc[u].gscale[r] = __ldg(static_cast<const unsigned short*>(w.scales) + srow[r] + g);
          } else {
            sc[u].scale[r] = __ldg(static_cast<const float*>(w.scales) + srow[r] + g);
            if (w.mins) sc[u].minv[r] = __ldg(w.mins + srow[r] + g);
          }
        }
      }
    }
    if (!waited) {
      pdl_sync();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kGemvMmaQuadsInFlight; ++u) {
      if (j0 + u * quad_step >= quads) break;  // warp-uniform
      const int g = 4 * (j0 + u * quad_step) + t;
      mma_granule<C>(c, wv[u], sc[u], g < granules ? x + static_cast<size_t>(g) * V : nullptr);
    }
  }
  if (!waited) pdl_sync();  // a warp without quads still orders its caller's stores
}

#endif  // __CUDACC__

}  // namespace moebatch::kernels
