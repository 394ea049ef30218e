#include <climits>
#include <string>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemm.cuh"
#include "kernels/gemv_device.cuh"
#include "kernels/launch.cuh"
#include "kernels/quant.cuh"

namespace moebatch::kernels {
namespace {

constexpr float kE4m3Max = 448.f, kE2m1Max = 6.f;

// --- decode GEMV ----------------------------------------------------------------------------
//
// A warp owns R (1, 2 or 4) consecutive rows of W (the walk over k: kernels/gemv_device.cuh);
// partial sums meet in a warp shuffle reduction at the end. Blocks are two warps: with few rows
// (o_proj: 2048) there are still ~4 blocks per SM, spread evenly.

constexpr int kGemvWarps = 2;

struct GemvArgs {
  void* out = nullptr;  // [m, n] bf16 or f32
  bool out_f32 = false;
  const bf16* x = nullptr;  // [m, k]
  QuantMatrix w;            // [n, k]
  int n = 0, k = 0;
};

// Dense rows: warp w of the grid owns rows [R·w, R·w + R); the M activation rows are x's.
template <WeightCodec C, int M, int R>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvArgs a) {
  // pdl_sync() inside gemv_rows, after the first weight loads
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= a.n) return;  // whole warps only: the shuffles below need all 32 lanes
  int rows[R];  // rows past n (last warp) read row n - 1 and are not stored
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = min(row0 + r, a.n - 1);
  const bf16* xrows[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xrows[i] = a.x + static_cast<size_t>(i) * a.k;
  float acc[R][M];
  gemv_rows<C, M, R>(a.w, a.k, rows, xrows, M, acc);

  // R · M ≤ 16 sums; lane r · M + i stores sum (r, i).
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = warp_sum(acc[r][i]);
      if (lane == r * M + i && row < a.n) {
        if constexpr (C == WeightCodec::Nvfp4) v *= __ldg(a.w.row_scales + row);
        const size_t o = static_cast<size_t>(i) * a.n + row;
        if (a.out_f32)
          static_cast<float*>(a.out)[o] = v;
        else
          static_cast<bf16*>(a.out)[o] = __float2bfloat16_rn(v);
      }
    }
  }
}

template <int R>
int gemv_blocks(const GemvArgs& a) {
  return CEIL_DIV(CEIL_DIV(a.n, R), kGemvWarps);
}

template <WeightCodec C, int M, int R>
void launch_gemv(const GemvArgs& a, cudaStream_t stream) {
  static_assert(R * M <= 32, "one lane stores each (row, activation row) sum");
  launch_dependent(gemv_kernel<C, M, R>, gemv_blocks<R>(a), kGemvWarps * 32, 0, stream, a);
  CUDA_CHECK_LAST();
}

// R (rows per warp) so that a lane's 8 loads per chunk are real granules: 4 when a row gives a
// lane fewer than 4 (short nvfp4 rows), 1 at one activation row when it gives 8 or more (twice
// the warps: o_proj has only 2048 rows) unless that grid just overflows one wave of resident
// blocks while R = 2 fits in one (bf16 qkv at batch 1: 2560 blocks, 2376 resident on an H200;
// the few blocks of a second wave each cost a whole load round trip more), else 2. With more
// activation rows the shared bf16 → fp32 conversion of x matters (the kernel turns FMA-bound), so
// R stays ≥ 2; above 4 rows R = 2 keeps R · M ≤ 16 accumulators.
template <WeightCodec C, int M>
void launch_gemv_m(const GemvArgs& a, cudaStream_t stream) {
  const int per_lane = CEIL_DIV(a.k / codec_granule(C), 32);
  if constexpr (M == 1) {
    if (per_lane >= 8 && !wider_saves_a_wave(gemv_kernel<C, M, 1>, gemv_blocks<1>(a),
                                             gemv_kernel<C, M, 2>, gemv_blocks<2>(a),
                                             kGemvWarps * 32))
      return launch_gemv<C, M, 1>(a, stream);
  }
  if constexpr (M <= 4) {
    if (per_lane < 4) return launch_gemv<C, M, 4>(a, stream);
  }
  launch_gemv<C, M, 2>(a, stream);
}

template <WeightCodec C>
void launch_gemv_codec(const GemvArgs& a, int m, cudaStream_t stream) {
  switch (m) {
    case 1:
      return launch_gemv_m<C, 1>(a, stream);
    case 2:
      return launch_gemv_m<C, 2>(a, stream);
    case 3:
      return launch_gemv_m<C, 3>(a, stream);
    case 4:
      return launch_gemv_m<C, 4>(a, stream);
    case 5:
      return launch_gemv_m<C, 5>(a, stream);
    case 6:
      return launch_gemv_m<C, 6>(a, stream);
    case 7:
      return launch_gemv_m<C, 7>(a, stream);
    case 8:
      return launch_gemv_m<C, 8>(a, stream);
    default:
      MB_CHECK(false, "gemv_quant: m must be in [1, kGemvMaxRows]");
  }
}

bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

void gemv_impl(void* out, bool out_f32, const bf16* x, const QuantMatrix& w, int m, int n, int k,
               cudaStream_t stream) {
  MB_CHECK(m >= 0 && m <= kGemvMaxRows && n > 0 && k > 0,
           "gemv_quant: bad shape (m <= kGemvMaxRows)");
  MB_CHECK(k % codec_granule(w.codec) == 0,
           "gemv_quant: k must be a multiple of the codec granule (8/16/32)");
  MB_CHECK(out && x && w.data, "gemv_quant: null operand");
  MB_CHECK(aligned(x, 16) && aligned(w.data, 16),
           "gemv_quant: x and W data must be 16-byte aligned");
  if (m == 0) return;
  GemvArgs a;
  a.out = out;
  a.out_f32 = out_f32;
  a.x = x;
  a.w = w;
  a.n = n;
  a.k = k;
  check_quant_matrix(w, "gemv_quant");
  return with_codec(w.codec, [&]<WeightCodec C>() { return launch_gemv_codec<C>(a, m, stream); });
}

// --- dequantize -----------------------------------------------------------------------------

// One thread per 8 consecutive values of a row.
__global__ void dequantize_kernel(QuantMatrix w, int64_t rows, int cols, bf16* out) {
  pdl_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int per_row = cols / 8;
  if (i >= rows * per_row) return;
  const int r = static_cast<int>(i / per_row);
  const int c = static_cast<int>(i % per_row) * 8;
  uint4 v = load_decode8(w, cols, r, c);
  bf16* dst = out + static_cast<size_t>(r) * cols + c;
  if (w.codec == WeightCodec::Nvfp4) {
    const float rs = w.row_scales[r];
    float f[8];
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 p = bf16x2_to_float2(u[j]);
      f[2 * j] = p.x * rs;
      f[2 * j + 1] = p.y * rs;
    }
    store8(dst, f);
    return;
  }
  *reinterpret_cast<uint4*>(dst) = v;
}

// --- quantizers -----------------------------------------------------------------------------

// Nearest E2M1 code of q (magnitudes 0 .5 1 1.5 2 3 4 6, saturating), ties to the even code;
// the sign bit only on a nonzero magnitude. The host reference (tests/gpu/ops/cases_quant.cpp)
// has the same thresholds.
__device__ __forceinline__ unsigned e2m1_code(float q) {
  const float a = fabsf(q);
  const unsigned m = a <= 0.25f   ? 0u
                     : a < 0.75f  ? 1u
                     : a <= 1.25f ? 2u
                     : a < 1.75f  ? 3u
                     : a <= 2.5f  ? 4u
                     : a < 3.5f   ? 5u
                     : a <= 5.f   ? 6u
                                  : 7u;
  return q < 0.f && m != 0u ? m | 8u : m;
}

// One warp per (row, group): amax, scale, then the codes. Scales land at r * groups + g, or
// group-major at g * scales_ld + r when scales_ld > 0. vector_ok: `in` 8-byte and `data` 4-byte
// aligned (then every whole 128-group is, as cols % 16 == 0).
__global__ void quantize_fp8_kernel(const bf16* in, int64_t rows, int cols, int group,
                                    int row_block, uint8_t* data, float* scales, int scales_ld,
                                    bool vector_ok) {
  pdl_sync();
  const int lane = threadIdx.x & 31;
  const int groups = (cols + group - 1) / group;
  const int64_t blocks = (rows + row_block - 1) / row_block;
  const int64_t wid = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (wid >= blocks * groups) return;  // warp-uniform
  const int64_t r0 = wid / groups * row_block, r1 = min(rows, r0 + row_block);
  const int g = static_cast<int>(wid % groups), c0 = g * group;
  const int len = min(group, cols - c0);
  auto scale_at = [&](int64_t r) -> float& {
    return scales_ld > 0 ? scales[g * static_cast<int64_t>(scales_ld) + r] : scales[r * groups + g];
  };
  if (row_block == 1 && len == 128 && vector_ok) {
    // The activations' common case: one 8-byte load and one 4-byte store per lane.
    const bf16* src = in + r0 * cols + c0 + lane * 4;
    float v[4];
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    v[0] = __low2float(lo), v[1] = __high2float(lo), v[2] = __low2float(hi), v[3] = __high2float(hi);
    const float amax = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
    const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
    if (lane == 0) scale_at(r0) = scale;
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      packed |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(v[j] / scale, __NV_SATFINITE, __NV_E4M3)) << (8 * j);
    *reinterpret_cast<uint32_t*>(data + r0 * cols + c0 + lane * 4) = packed;
    return;
  }
  float amax = 0.f;
  for (int64_t r = r0; r < r1; ++r)
    for (int c = lane; c < len; c += 32) amax = fmaxf(amax, fabsf(__bfloat162float(in[r * cols + c0 + c])));
  amax = warp_max(amax);
  const float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
  for (int64_t r = r0; r < r1; ++r) {
    if (lane == 0) scale_at(r) = scale;
    const bf16* src = in + r * cols + c0;
    uint8_t* dst = data + r * cols + c0;
    for (int c = lane; c < len; c += 32)
      dst[c] = __nv_cvt_float_to_fp8(__bfloat162float(src[c]) / scale, __NV_SATFINITE, __NV_E4M3);
  }
}

// Clears *uniform when a row's scale differs from that of the first row of its block.
__global__ void scales_block_uniform_kernel(const float* scales, int64_t rows, int groups, int row_block,
                                            int* uniform) {
  pdl_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * groups) return;
  const int64_t r = i / groups, first = r / row_block * row_block;
  if (scales[i] != scales[first * groups + i % groups]) *uniform = 0;
}

// One warp per row: the row amax, then 256 columns per step, lane pairs (2j, 2j + 1) sharing
// one 16-input group.
__global__ void quantize_nvfp4_kernel(const bf16* in, int64_t rows, int cols, uint8_t* data,
                                      uint8_t* scales, float* row_scales) {
  pdl_sync();
  const int lane = threadIdx.x & 31;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return;  // warp-uniform
  const bf16* src = in + r * cols;
  float amax = 0.f;
  for (int c = lane * 8; c < cols; c += 256) {
    float v[8];
    load8(src + c, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = warp_max(amax);
  const float rs = amax > 0.f ? amax / (kE4m3Max * kE2m1Max) : 1.f;
  if (lane == 0) row_scales[r] = rs;
  for (int base = 0; base < cols; base += 256) {  // warp-uniform
    const int c = base + lane * 8;
    const bool valid = c < cols;  // cols % 16 == 0: both lanes of a group agree
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (valid) load8(src + c, v);
    float gmax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) gmax = fmaxf(gmax, fabsf(v[j]));
    gmax = fmaxf(gmax, __shfl_xor_sync(kFullMask, gmax, 1));
    const unsigned char sb =
        __nv_cvt_float_to_fp8(gmax / (kE2m1Max * rs), __NV_SATFINITE, __NV_E4M3);
    const float denom = e4m3_to_float(sb) * rs;
    unsigned codes = 0;
    if (denom > 0.f) {
#pragma unroll
      for (int j = 0; j < 8; ++j) codes |= e2m1_code(v[j] / denom) << (4 * j);
    }
    if (valid) {
      if ((lane & 1) == 0) scales[r * (cols / 16) + c / 16] = sb;
      *reinterpret_cast<unsigned*>(data + r * (cols / 2) + c / 2) = codes;
    }
  }
}

// One warp per (row, 32-input group): lane i quantizes input i; lanes 2j and 2j + 1 share
// output byte j.
__global__ void quantize_int4_kernel(const bf16* in, int64_t rows, int cols, uint8_t* data,
                                     float* scales, float* mins) {
  pdl_sync();
  const int lane = threadIdx.x & 31;
  const int groups = cols / 32;
  const int64_t wid = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (wid >= rows * groups) return;  // warp-uniform
  const float v = __bfloat162float(in[wid * 32 + lane]);  // rows are contiguous groups of 32
  const float lo = -warp_max(-v), hi = warp_max(v);
  const float scale = hi > lo ? (hi - lo) / 15.f : 1.f;
  const unsigned code = static_cast<unsigned>(fminf(fmaxf(rintf((v - lo) / scale), 0.f), 15.f));
  const unsigned other = __shfl_xor_sync(kFullMask, code, 1);
  if ((lane & 1) == 0) data[wid * 16 + lane / 2] = static_cast<uint8_t>(code | other << 4);
  if (lane == 0) {
    scales[wid] = scale;
    mins[wid] = -lo;
  }
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t threads) {
  const int64_t b = CEIL_DIV(threads, static_cast<int64_t>(kThreads));
  MB_CHECK(b <= INT_MAX, "grid too large");
  return static_cast<unsigned>(b);
}

template <typename Out>
void quant_linear_impl(cublasHandle_t handle, cudaStream_t stream, Out* out, const bf16* x,
                       const QuantMatrix& w, int m, int n, int k, bf16* scratch,
                       size_t scratch_elems) {
  switch (quant_linear_path(w.codec, m)) {
    case QuantLinearPath::Cublas:
      return linear(handle, stream, out, x, static_cast<const bf16*>(w.data), m, n, k);
    case QuantLinearPath::Gemv:
      return gemv_quant(out, x, w, m, n, k, stream);
    case QuantLinearPath::DequantCublas:
      MB_CHECK(scratch && scratch_elems >= static_cast<size_t>(n) * k,
               "quant_linear: the dequantize path needs a scratch of n * k bf16");
      dequantize(w, n, k, scratch, stream);
      return linear(handle, stream, out, x, scratch, m, n, k);
  }
}

}  // namespace

void check_quant_matrix(const QuantMatrix& w, const char* op) {
  const std::string name(op);
  switch (w.codec) {
    case WeightCodec::Bf16:
      return;
    case WeightCodec::Fp8Block:
      MB_CHECK(w.scales && aligned(w.scales, 4) && w.group > 0 && w.group % 16 == 0,
               name + ": fp8 weights need f32 block scales and a group that is a positive "
                      "multiple of 16");
      return;
    case WeightCodec::Nvfp4:
      // a granule's two group-scale bytes are read as one 2-byte load
      MB_CHECK(w.scales && aligned(w.scales, 2) && w.row_scales && w.group == 16,
               name + ": nvfp4 weights need 2-byte aligned group scales, row scales and group 16");
      return;
    case WeightCodec::Int8:
    case WeightCodec::Int4:
      MB_CHECK(w.scales && aligned(w.scales, 4) && (!w.mins || aligned(w.mins, 4)) &&
                   (w.codec == WeightCodec::Int4 ? w.group == 32 && w.mins
                                                 : w.group == 16 || w.group == 32),
               name + ": int8 weights need f32 group scales and a group of 16 or 32, int4 "
                      "weights f32 scales and mins per 32");
      return;
  }
  throw Error(name + ": unknown weight codec");
}

const char* quant_linear_path_name(QuantLinearPath p) {
  switch (p) {
    case QuantLinearPath::Cublas:
      return "cuBLAS";
    case QuantLinearPath::Gemv:
      return "gemv";
    case QuantLinearPath::DequantCublas:
      return "dequant+cuBLAS";
  }
  return "?";
}

void gemv_quant(bf16* out, const bf16* x, const QuantMatrix& w, int m, int n, int k,
                cudaStream_t stream) {
  gemv_impl(out, false, x, w, m, n, k, stream);
}

void gemv_quant(float* out, const bf16* x, const QuantMatrix& w, int m, int n, int k,
                cudaStream_t stream) {
  gemv_impl(out, true, x, w, m, n, k, stream);
}

void dequantize(const QuantMatrix& w, int64_t rows, int cols, bf16* out, cudaStream_t stream) {
  MB_CHECK(rows >= 0 && rows <= INT_MAX && cols > 0, "dequantize: bad shape");
  MB_CHECK(cols % (codec_is_4bit(w.codec) ? 32 : 16) == 0,
           "dequantize: cols must be a multiple of 16 (4-bit codecs: 32)");
  MB_CHECK(out && w.data && aligned(out, 16) && aligned(w.data, 16),
           "dequantize: null or misaligned operand");
  check_quant_matrix(w, "dequantize");
  if (rows == 0) return;
  const int64_t threads = rows * (cols / 8);
  launch_dependent(dequantize_kernel, blocks_for(threads), kThreads, 0, stream, w, rows, cols, out);
  CUDA_CHECK_LAST();
}

void quantize_int4_rows(const bf16* in, int64_t rows, int cols, uint8_t* data, float* scales,
                        float* mins, cudaStream_t stream) {
  MB_CHECK(rows >= 0 && cols > 0 && cols % 32 == 0, "quantize_int4_rows: cols must be a multiple of 32");
  MB_CHECK(in && data && scales && mins, "quantize_int4_rows: null operand");
  if (rows == 0) return;
  launch_dependent(quantize_int4_kernel, blocks_for(rows * (cols / 32) * 32), kThreads, 0, stream,
                   in, rows, cols, data, scales, mins);
  CUDA_CHECK_LAST();
}

void quant_linear(cublasHandle_t handle, cudaStream_t stream, bf16* out, const bf16* x,
                  const QuantMatrix& w, int m, int n, int k, bf16* scratch, size_t scratch_elems) {
  quant_linear_impl(handle, stream, out, x, w, m, n, k, scratch, scratch_elems);
}

void quant_linear(cublasHandle_t handle, cudaStream_t stream, float* out, const bf16* x,
                  const QuantMatrix& w, int m, int n, int k, bf16* scratch, size_t scratch_elems) {
  quant_linear_impl(handle, stream, out, x, w, m, n, k, scratch, scratch_elems);
}

void quantize_fp8_rows(const bf16* in, int64_t rows, int cols, int group, uint8_t* data,
                       float* scales, cudaStream_t stream, int row_block, int scales_ld) {
  MB_CHECK(rows >= 0 && cols > 0 && cols % 16 == 0,
           "quantize_fp8_rows: cols must be a positive multiple of 16");
  MB_CHECK(group > 0 && group % 16 == 0,
           "quantize_fp8_rows: group must be a positive multiple of 16");
  MB_CHECK(row_block > 0, "quantize_fp8_rows: row_block must be positive");
  MB_CHECK(scales_ld == 0 || (scales_ld >= rows && row_block == 1),
           "quantize_fp8_rows: group-major scales need row_block 1 and scales_ld >= rows");
  MB_CHECK(in && data && scales, "quantize_fp8_rows: null operand");
  if (rows == 0) return;
  const int64_t warps = (rows + row_block - 1) / row_block * ((cols + group - 1) / group);
  launch_dependent(quantize_fp8_kernel, blocks_for(warps * 32), kThreads, 0, stream, in, rows, cols,
                   group, row_block, data, scales, scales_ld,
                   reinterpret_cast<uintptr_t>(in) % 8 == 0 && reinterpret_cast<uintptr_t>(data) % 4 == 0);
  CUDA_CHECK_LAST();
}

bool scales_block_uniform(const float* scales, int64_t rows, int groups, int row_block, cudaStream_t stream) {
  MB_CHECK(rows >= 0 && groups > 0 && row_block > 0 && scales, "scales_block_uniform: bad arguments");
  if (rows == 0) return true;
  int* flag = nullptr;
  CUDA_CHECK(cudaMallocAsync(&flag, sizeof(int), stream));
  const int one = 1;
  CUDA_CHECK(cudaMemcpyAsync(flag, &one, sizeof(int), cudaMemcpyHostToDevice, stream));
  launch_dependent(scales_block_uniform_kernel, blocks_for(rows * groups), kThreads, 0, stream,
                   scales, rows, groups, row_block, flag);
  CUDA_CHECK_LAST();
  int uniform = 0;
  CUDA_CHECK(cudaMemcpyAsync(&uniform, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaFreeAsync(flag, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return uniform != 0;
}

void quantize_nvfp4_rows(const bf16* in, int64_t rows, int cols, uint8_t* data, uint8_t* scales,
                         float* row_scales, cudaStream_t stream) {
  MB_CHECK(rows >= 0 && cols > 0 && cols % 32 == 0,
           "quantize_nvfp4_rows: cols must be a positive multiple of 32");
  MB_CHECK(in && data && scales && row_scales, "quantize_nvfp4_rows: null operand");
  MB_CHECK(aligned(in, 16) && aligned(data, 4),
           "quantize_nvfp4_rows: in must be 16-byte, data 4-byte aligned");
  if (rows == 0) return;
  launch_dependent(quantize_nvfp4_kernel, blocks_for(rows * 32), kThreads, 0, stream, in, rows,
                   cols, data, scales, row_scales);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
