// The weight walk of the decode GEMVs (kernels/quant.cu for dense layers, kernels/moe_gemv.cu
// for routed experts), device code only: one warp multiplies R rows of a weight matrix in any
// codec with M activation rows over all of k, leaving per-lane fp32 partial sums.
//
// k is walked in 16-byte granules (8 bf16, 16 fp8 / int8 or 32 fp4 / int4 values): lane l takes
// granules l, l + 32, ... of every one of its rows, so the R rows share each activation load and
// its bf16 → fp32 conversion. Per chunk of U granules a lane first issues all R · U = 8 16-byte
// loads, then decodes and multiplies them. The codecs with f32 group scales (Fp8Block, Int8,
// Int4; a granule lies inside one group) sum each granule's codes times the activations unscaled
// and apply the scale once per granule, Int8 / Int4 subtracting min · Σ activations; Nvfp4
// decodes to exact bf16 (code · group scale) and leaves the row scale to the caller's epilogue;
// Bf16 is used as is. Activations (≤ 8 rows, read by every warp) go through L1 (__ldg); weights,
// read once per call, are loaded evict-first (__ldcs) so they do not push the activations out.
// The first chunk's weight loads are issued before pdl_sync() (kernels/launch.cuh): weights are
// constants, so a GEMV launched dependent has them in flight before its input exists.
#pragma once

#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/weight_codec.cuh"

namespace moebatch::kernels {

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

// Integer codes as fp32 through the float 2^23 + c (its mantissa holds c; exact for 0 ≤ c <
// 2^23) minus 2^23 + bias, one exact add: a logic op and an add where a conversion (I2F)
// issues at a quarter of their rate — the compressed one-token GEMVs are bound by issue.
template <int kBias = 0>
__device__ __forceinline__ float code_to_float(unsigned c) {
  return __int_as_float(0x4B000000 | c) - (8388608.f + kBias);
}

// Two int8 codes (low byte first) as fp32: exact (each biased by 128 into [0, 256)).
__device__ __forceinline__ float2 i8x2_to_float2(unsigned two) {
  const unsigned b = two ^ 0x8080u;  // q + 128 of both bytes
  return make_float2(code_to_float<128>(b & 0xffu), code_to_float<128>((b >> 8) & 0xffu));
}

// Two 4-bit codes (low nibble first) as fp32: exact.
__device__ __forceinline__ float2 u4x2_to_float2(unsigned two) {
  return make_float2(code_to_float(two & 0xfu), code_to_float((two >> 4) & 0xfu));
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

  constexpr bool kGroups = codec_has_f32_groups(C);  // f32 scale per group, applied per granule
  constexpr bool kInt = C == WeightCodec::Int8 || C == WeightCodec::Int4;  // codes minus a min
  const unsigned char* wrow[R];
  size_t srow[R];  // scale-row base (elements): f32 groups, or nvfp4 u16 pairs
  const int group_cols = kGroups ? (k + w.group - 1) / w.group : 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wrow[r] = static_cast<const unsigned char*>(w.data) + static_cast<size_t>(rows[r]) * row_bytes;
    srow[r] = static_cast<size_t>(rows[r]) * (kGroups ? group_cols : k / 32);
  }
  const float* group_scales = static_cast<const float*>(w.scales);
  const float* group_mins = kInt ? w.mins : nullptr;
  const unsigned short* fp4_scales = static_cast<const unsigned short*>(w.scales);

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.f;

  for (int chunk = 0; chunk < granules; chunk += 32 * U) {  // warp-uniform
    uint4 wv[U][R];
    float fscale[U][R];           // f32 group scale
    float fmin[U][R];             // Int8 / Int4 group min
    unsigned short gscale[U][R];  // Nvfp4 group scales of the granule's two groups
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int g = chunk + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = make_uint4(0, 0, 0, 0);
        fscale[u][r] = 0.f;
        fmin[u][r] = 0.f;
        gscale[u][r] = 0;
        if (g < granules) {
          wv[u][r] = __ldcs(reinterpret_cast<const uint4*>(wrow[r] + static_cast<size_t>(g) * 16));
          if constexpr (kGroups)
            fscale[u][r] = __ldg(group_scales + srow[r] + g * V / w.group);
          if constexpr (kInt)
            if (group_mins) fmin[u][r] = __ldg(group_mins + srow[r] + g * V / w.group);
          if constexpr (C == WeightCodec::Nvfp4) gscale[u][r] = __ldg(fp4_scales + srow[r] + g);
        }
      }
    }
    // The first chunk's weights are in flight; only now wait for the kernel before (the
    // activations are its output): a GEMV launched dependent streams weights while it finishes.
    if (chunk == 0) pdl_sync();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int g = chunk + u * 32 + lane;
      if (g >= granules) continue;
      float part[R][M];  // f32 groups: this granule's unscaled sums
      float xsum[M];     // Int8 / Int4: Σ activations over the granule (times the min)
#pragma unroll
      for (int i = 0; i < M; ++i) xsum[i] = 0.f;
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
            if (i < m_active) {
              xq[i] = bf16x2_to_float2(word_of(xv[i], q));
              if constexpr (kInt) xsum[i] += xq[i].x + xq[i].y;
            }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float2 wq;
            if constexpr (C == WeightCodec::Fp8Block)
              wq = fp8x2_to_float2(word_of(wv[u][r], 2 * p + q / 2) >> (16 * (q & 1)));
            else if constexpr (C == WeightCodec::Int8)
              wq = i8x2_to_float2(word_of(wv[u][r], 2 * p + q / 2) >> (16 * (q & 1)));
            else if constexpr (C == WeightCodec::Int4)
              wq = u4x2_to_float2(word_of(wv[u][r], p) >> (8 * q));
            else
              wq = bf16x2_to_float2(word_of(wp[r], q));
#pragma unroll
            for (int i = 0; i < M; ++i) {
              if (i >= m_active) break;
              if constexpr (kGroups) {
                part[r][i] = fmaf(wq.y, xq[i].y, fmaf(wq.x, xq[i].x, part[r][i]));
              } else {
                acc[r][i] = fmaf(wq.y, xq[i].y, fmaf(wq.x, xq[i].x, acc[r][i]));
              }
            }
          }
        }
      }
      if constexpr (kGroups) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < M; ++i)
            if (i < m_active)
              acc[r][i] = fmaf(part[r][i], fscale[u][r], fmaf(-fmin[u][r], xsum[i], acc[r][i]));
      }
    }
  }
}

}  // namespace moebatch::kernels
