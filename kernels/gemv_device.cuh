// The weight walk of the decode GEMVs (kernels/quant.cu for dense layers, kernels/moe_gemv.cu
// for routed experts), device code only: one warp multiplies R rows of a weight matrix in any
// codec with M activation rows over all of k, leaving per-lane fp32 partial sums.
//
// k is walked in 16-byte granules (8 bf16, 16 fp8 or 32 fp4 values): lane l takes granules
// l, l + 32, ... of every one of its rows, so the R rows share each activation load and its
// bf16 → fp32 conversion. Per chunk of U granules a lane first issues all R · U = 8 16-byte
// loads, then decodes and multiplies them. Fp8Block sums each granule (16 values, one block
// scale since group % 16 == 0) unscaled and applies the fp32 scale once per granule; Nvfp4
// decodes to exact bf16 (code · group scale) and leaves the row scale to the caller's epilogue;
// Bf16 is used as is. Activations (≤ 8 rows, read by every warp) go through L1 (__ldg); weights,
// read once per call, are loaded evict-first (__ldcs) so they do not push the activations out.
#pragma once

#include "kernels/device_common.cuh"
#include "kernels/weight_codec.cuh"

namespace moebatch::kernels {

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// A bf16 pair (low half first) as fp32: exact.
__device__ __forceinline__ float2 bf16x2_to_float2(unsigned u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Two E4M3 bytes (low byte first) as fp32: exact (through half).
__device__ __forceinline__ float2 fp8x2_to_float2(unsigned two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

/// acc[r][i] = this lane's share of Σ_k W[rows[r], k] · xrows[i][k] (fp32; reduce over the warp,
/// then apply an Nvfp4 row scale) for i < m_active (warp-uniform, ≤ M: the rest are skipped and
/// stay 0). rows: matrix rows (stacked experts flattened); xrows: 16-byte aligned activation
/// rows of k values. Every lane of the warp must call it.
template <WeightCodec C, int M, int R>
__device__ __forceinline__ void gemv_rows(const QuantMatrix& w, int k, const int (&rows)[R],
                                          const bf16* const (&xrows)[M], int m_active,
                                          float (&acc)[R][M]) {
  constexpr int V = codec_granule(C);  // values per granule
  constexpr int U = 8 / R;             // granules per row per lane per chunk
  const int lane = threadIdx.x & 31;
  const int granules = k / V;
  const size_t row_bytes = codec_row_bytes(C, k);

  const unsigned char* wrow[R];
  size_t srow[R];  // scale-row base (elements): fp8 f32, nvfp4 u16 pairs
  const int fp8_scale_cols = C == WeightCodec::Fp8Block ? (k + w.group - 1) / w.group : 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wrow[r] = static_cast<const unsigned char*>(w.data) + static_cast<size_t>(rows[r]) * row_bytes;
    srow[r] = static_cast<size_t>(rows[r]) *
              (C == WeightCodec::Fp8Block ? fp8_scale_cols : k / 32);
  }
  const float* fp8_scales = static_cast<const float*>(w.scales);
  const unsigned short* fp4_scales = static_cast<const unsigned short*>(w.scales);

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.f;

  for (int chunk = 0; chunk < granules; chunk += 32 * U) {  // warp-uniform
    uint4 wv[U][R];
    float fscale[U][R];           // Fp8Block block scale
    unsigned short gscale[U][R];  // Nvfp4 group scales of the granule's two groups
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int g = chunk + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = make_uint4(0, 0, 0, 0);
        fscale[u][r] = 0.f;
        gscale[u][r] = 0;
        if (g < granules) {
          wv[u][r] = __ldcs(reinterpret_cast<const uint4*>(wrow[r] + static_cast<size_t>(g) * 16));
          if constexpr (C == WeightCodec::Fp8Block)
            fscale[u][r] = __ldg(fp8_scales + srow[r] + g * V / w.group);
          if constexpr (C == WeightCodec::Nvfp4) gscale[u][r] = __ldg(fp4_scales + srow[r] + g);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int g = chunk + u * 32 + lane;
      if (g >= granules) continue;
      float part[R][M];  // Fp8Block: this granule's unscaled sums
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) part[r][i] = 0.f;
#pragma unroll
      for (int p = 0; p < V / 8; ++p) {  // 8-value pieces of the granule
        uint4 xv[M];
#pragma unroll
        for (int i = 0; i < M; ++i)
          if (i < m_active)
            xv[i] = __ldg(reinterpret_cast<const uint4*>(xrows[i] + static_cast<size_t>(g) * V + 8 * p));
        uint4 wp[R];  // Bf16 / Nvfp4: the piece as four bf16 pairs
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (C == WeightCodec::Nvfp4)
            wp[r] = decode_fp4x8(
                word_of(wv[u][r], p),
                fp4_group_scale(static_cast<unsigned char>(gscale[u][r] >> (8 * (p / 2)))));
          else
            wp[r] = wv[u][r];
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // value pairs of the piece
          float2 xq[M];
#pragma unroll
          for (int i = 0; i < M; ++i)
            if (i < m_active) xq[i] = bf16x2_to_float2(word_of(xv[i], q));
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float2 wq;
            if constexpr (C == WeightCodec::Fp8Block)
              wq = fp8x2_to_float2(word_of(wv[u][r], 2 * p + q / 2) >> (16 * (q & 1)));
            else
              wq = bf16x2_to_float2(word_of(wp[r], q));
#pragma unroll
            for (int i = 0; i < M; ++i) {
              if (i >= m_active) break;
              if constexpr (C == WeightCodec::Fp8Block) {
                part[r][i] = fmaf(wq.y, xq[i].y, fmaf(wq.x, xq[i].x, part[r][i]));
              } else {
                acc[r][i] = fmaf(wq.y, xq[i].y, fmaf(wq.x, xq[i].x, acc[r][i]));
              }
            }
          }
        }
      }
      if constexpr (C == WeightCodec::Fp8Block) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < M; ++i)
            if (i < m_active) acc[r][i] = fmaf(part[r][i], fscale[u][r], acc[r][i]);
      }
    }
  }
}

}  // namespace moebatch::kernels
