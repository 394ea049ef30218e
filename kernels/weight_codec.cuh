// Compressed weight matrices as kernels see them, and the register-level decoders every
// weight-taking kernel shares (decode GEMV, grouped expert GEMM, dequantize). The byte layouts
// are the device forms engine/packed_weights.h writes; they keep the checkpoint's bytes as they
// are, with scales repeated per row so that any row split or stacking of tensors (tensor
// parallelism, fused q/k/v, stacked experts) needs no re-blocking.
//
//   Fp8Block  data   e4m3 [rows, cols]
//             scales f32  [rows, ceil(cols / group)]   w = e4m3 · scale[row, col / group]
//   Nvfp4     data   u8   [rows, cols / 2]             element 2j in the low nibble of byte j
//             scales e4m3 [rows, cols / 16]
//             row_scales f32 [rows]                    w = e2m1 · scale[row, col / 16] · row_scale[row]
//   Int8      data   i8   [rows, cols]
//             scales f32  [rows, cols / group]         w = q · scale[row, col / group]
//             mins   f32  [rows, cols / group] or none      − min[row, col / group]
//   Int4      data   u8   [rows, cols / 2]             element 2j in the low nibble of byte j
//             scales f32  [rows, cols / 32]            w = q · scale[row, col / 32]
//             mins   f32  [rows, cols / 32]                 − min[row, col / 32]
//
// Int8 and Int4 carry GGUF's integer formats without loss: Q8_0 (Int8, group 32), Q6_K (Int8,
// group 16, q − 32), Q5_K (Int8 with mins, group 32) and Q4_K (Int4): every k-quant sub-block's
// scale and min, d · sc and dmin · m, are exact fp32 products, so the load only re-lays the
// codes and spells out the sub-block scales (engine/packed_weights.h).
//
// Decoding is exact where it can be: an E2M1 code times its E4M3 group scale has at most six
// significant bits, so it is formed exactly in bf16 and the row scale is applied to the fp32
// accumulator in the GEMM epilogue; an FP8 value times its fp32 block scale is rounded once to
// bf16 (the tensor-core operand type).
#pragma once

#include <cuda_fp8.h>

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// How a weight matrix's bytes encode its values.
enum class WeightCodec : int { Bf16 = 0, Fp8Block = 1, Nvfp4 = 2, Int8 = 3, Int4 = 4 };

/// fn.template operator()<C>() for the compile-time codec C of `codec` (host side): the one switch
/// that turns a weight's codec into kernel instantiations; each op picks its kernels inside fn.
template <typename Fn>
decltype(auto) with_codec(WeightCodec codec, Fn&& fn) {
  switch (codec) {
    case WeightCodec::Fp8Block: return fn.template operator()<WeightCodec::Fp8Block>();
    case WeightCodec::Nvfp4: return fn.template operator()<WeightCodec::Nvfp4>();
    case WeightCodec::Int8: return fn.template operator()<WeightCodec::Int8>();
    case WeightCodec::Int4: return fn.template operator()<WeightCodec::Int4>();
    case WeightCodec::Bf16: break;
  }
  return fn.template operator()<WeightCodec::Bf16>();
}

/// A [rows, cols] row-major weight matrix (leading dims of a stacked tensor flattened into rows)
/// in one codec. Pointers are device memory; absent fields are nullptr.
struct QuantMatrix {
  WeightCodec codec = WeightCodec::Bf16;
  const void* data = nullptr;         ///< values (layout above)
  const void* scales = nullptr;       ///< Fp8Block, Int8, Int4: f32; Nvfp4: e4m3 per 16 inputs
  const float* row_scales = nullptr;  ///< Nvfp4 only
  const float* mins = nullptr;        ///< Int8 (optional), Int4: f32 per group, subtracted
  int group = 0;  ///< inputs per scale: Fp8Block a multiple of 16; Int8 16 or 32; Nvfp4 16; Int4 32
};

/// One byte per input (the 16-byte granule holds 16 values).
__host__ __device__ constexpr bool codec_is_8bit(WeightCodec c) {
  return c == WeightCodec::Fp8Block || c == WeightCodec::Int8;
}
/// Half a byte per input (the 16-byte granule holds 32 values).
__host__ __device__ constexpr bool codec_is_4bit(WeightCodec c) {
  return c == WeightCodec::Nvfp4 || c == WeightCodec::Int4;
}
/// Scales are f32 per group (Fp8Block, Int8, Int4), with the group dividing into granules.
__host__ __device__ constexpr bool codec_has_f32_groups(WeightCodec c) {
  return c == WeightCodec::Fp8Block || c == WeightCodec::Int8 || c == WeightCodec::Int4;
}

/// Inputs per 16-byte load of each codec (the unit a lane decodes at once).
__host__ __device__ constexpr int codec_granule(WeightCodec c) {
  return c == WeightCodec::Bf16 ? 8 : codec_is_8bit(c) ? 16 : 32;
}

/// Bytes of `cols` inputs of one row in the data array.
__host__ __device__ constexpr size_t codec_row_bytes(WeightCodec c, size_t cols) {
  return c == WeightCodec::Bf16 ? 2 * cols : codec_is_8bit(c) ? cols : cols / 2;
}

/// Throws Error naming `op` unless w's scale arrays, alignment and group fit its codec: the
/// operand checks every weight-taking kernel shares (kernels/quant.cu).
void check_quant_matrix(const QuantMatrix& w, const char* op);

// The register decoders below are device code: host translation units (engine, tests) see only
// the codec, the matrix view and the sizes above.
#ifdef __CUDACC__

/// 32-bit word i (0..3) of a 16-byte vector.
__device__ __forceinline__ unsigned word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// fp32 value of one E4M3 byte (no NaN handling: checkpoint scales and weights are finite).
__device__ __forceinline__ float e4m3_to_float(unsigned char b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

/// Two E4M3 bytes (low byte = first value) times `scale`, rounded once, as a bf16 pair.
__device__ __forceinline__ unsigned decode_fp8x2(unsigned short two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const unsigned*>(&b);
}

/// Eight E4M3 values (8 bytes, first value in the lowest byte) times `scale` as 8 bf16.
__device__ __forceinline__ uint4 decode_fp8x8(uint2 raw, float scale) {
  return make_uint4(decode_fp8x2(static_cast<unsigned short>(raw.x), scale),
                    decode_fp8x2(static_cast<unsigned short>(raw.x >> 16), scale),
                    decode_fp8x2(static_cast<unsigned short>(raw.y), scale),
                    decode_fp8x2(static_cast<unsigned short>(raw.y >> 16), scale));
}

/// Eight E2M1 codes (nibble i of `w` is value i) as 8 bf16 of code · `scale2` (scale2: the
/// E4M3 group scale as a bf16 pair, both halves equal; the product is exact).
/// Bytes of the bf16 magnitudes come from two 8-entry tables through byte permutes (the
/// selector's low three bits index the table; __byte_perm ignores the fourth, the code's sign).
/// The signs of values 2j and 2j + 1 are bits 8j + 3 and 8j + 7 of `w`: one more permute puts
/// byte j of w << 4 and of w at bytes 1 and 3, so they land on bits 15 and 31 of pair j.
__device__ __forceinline__ uint4 decode_fp4x8(unsigned w, __nv_bfloat162 scale2) {
  constexpr unsigned kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;  // high bytes of 0 .5 1 1.5 | 2 3 4 6
  constexpr unsigned kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;  // low bytes of the same
  const unsigned w4 = w << 4;
  unsigned out[4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const unsigned sel = w >> (16 * half);  // nibbles of values 4·half .. 4·half + 3
    const unsigned hi = __byte_perm(kHi0, kHi1, sel);
    const unsigned lo = __byte_perm(kLo0, kLo1, sel);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int j = 2 * half + p;  // the pair: values 2j, 2j + 1
      // bf16 pair of values 2j, 2j + 1: bytes lo(2p) hi(2p) lo(2p+1) hi(2p+1) of this half
      const unsigned v = __byte_perm(lo, hi, p == 0 ? 0x5140u : 0x7362u);
      const unsigned sign = __byte_perm(w4, w, static_cast<unsigned>((j << 4) | ((4 + j) << 12)));
      const unsigned bits = v | (sign & 0x80008000u);
      __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&bits);
      b = __hmul2(b, scale2);
      out[j] = *reinterpret_cast<unsigned*>(&b);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/// code · scale − min as ggml computes it (a rounded product, then a rounded difference: no
/// fused multiply-add), so decoded GGUF weights equal llama.cpp's before the bf16 rounding.
__device__ __forceinline__ float int_value(float code, float scale, float min) {
  return __fsub_rn(__fmul_rn(code, scale), min);
}

/// Eight int8 codes (8 bytes, first value in the lowest byte) as 8 bf16 of q · scale − min.
__device__ __forceinline__ uint4 decode_i8x8(uint2 raw, float scale, float min) {
  unsigned out[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned w = j < 2 ? raw.x : raw.y;
    const int sh = 16 * (j & 1);
    const float a = static_cast<float>(static_cast<signed char>((w >> sh) & 0xffu));
    const float b = static_cast<float>(static_cast<signed char>((w >> (sh + 8)) & 0xffu));
    const __nv_bfloat162 p = __floats2bfloat162_rn(int_value(a, scale, min), int_value(b, scale, min));
    out[j] = *reinterpret_cast<const unsigned*>(&p);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/// Eight unsigned 4-bit codes (nibble i of `w` is value i) as 8 bf16 of q · scale − min.
__device__ __forceinline__ uint4 decode_u4x8(unsigned w, float scale, float min) {
  unsigned out[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float a = static_cast<float>((w >> (8 * j)) & 0xfu);
    const float b = static_cast<float>((w >> (8 * j + 4)) & 0xfu);
    const __nv_bfloat162 p = __floats2bfloat162_rn(int_value(a, scale, min), int_value(b, scale, min));
    out[j] = *reinterpret_cast<const unsigned*>(&p);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/// The f32 scale and min of the group holding input k0 of row `row` (min 0 without mins).
__device__ __forceinline__ float2 group_scale_min(const QuantMatrix& w, int cols, size_t row,
                                                  int k0) {
  const size_t i = row * ((cols + w.group - 1) / w.group) + k0 / w.group;
  return make_float2(static_cast<const float*>(w.scales)[i], w.mins ? w.mins[i] : 0.f);
}

/// The E4M3 group scale byte as the bf16 pair decode_fp4x8 multiplies by (exact).
__device__ __forceinline__ __nv_bfloat162 fp4_group_scale(unsigned char b) {
  return __float2bfloat162_rn(e4m3_to_float(b));
}

/// Eight consecutive values (row r, columns k0 .. k0 + 7; k0 % 8 == 0) of `w` as 8 bf16, the
/// Nvfp4 row scale NOT applied. Simple kernels (dequantize, references) read through this; the
/// GEMMs load whole granules and decode with the functions above.
__device__ __forceinline__ uint4 load_decode8(const QuantMatrix& w, int cols, int r, int k0) {
  const size_t row = static_cast<size_t>(r);
  switch (w.codec) {
    case WeightCodec::Fp8Block: {
      const auto* d = static_cast<const unsigned char*>(w.data) + row * cols + k0;
      const int scale_cols = (cols + w.group - 1) / w.group;
      const float s = static_cast<const float*>(w.scales)[row * scale_cols + k0 / w.group];
      return decode_fp8x8(*reinterpret_cast<const uint2*>(d), s);
    }
    case WeightCodec::Nvfp4: {
      const auto* d = static_cast<const unsigned char*>(w.data) + row * (cols / 2) + k0 / 2;
      const auto* s = static_cast<const unsigned char*>(w.scales) + row * (cols / 16) + k0 / 16;
      return decode_fp4x8(*reinterpret_cast<const unsigned*>(d), fp4_group_scale(*s));
    }
    case WeightCodec::Int8: {
      const auto* d = static_cast<const unsigned char*>(w.data) + row * cols + k0;
      const float2 sm = group_scale_min(w, cols, row, k0);
      return decode_i8x8(*reinterpret_cast<const uint2*>(d), sm.x, sm.y);
    }
    case WeightCodec::Int4: {
      const auto* d = static_cast<const unsigned char*>(w.data) + row * (cols / 2) + k0 / 2;
      const float2 sm = group_scale_min(w, cols, row, k0);
      return decode_u4x8(*reinterpret_cast<const unsigned*>(d), sm.x, sm.y);
    }
    case WeightCodec::Bf16:
    default:
      return *reinterpret_cast<const uint4*>(static_cast<const bf16*>(w.data) + row * cols + k0);
  }
}

#endif  // __CUDACC__

}  // namespace moebatch::kernels
