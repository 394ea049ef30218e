// Device-side helpers shared by the kernels: warp/block reductions and scans, SiLU, 16-byte bf16
// vector access. Included only from .cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moebatch::kernels {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

/// SiLU for a value rounded to bf16 next (8 bits), on the special-function unit: one ex2 and one
/// reciprocal, each within 2 ulp. IEEE expf and division cost ~30 instructions per element; in
/// the wgmma expert GEMMs' gate+up epilogue (16,384 elements per tile) that kept the tensor cores
/// idle for ~8,000 of a tile's ~55,000 cycles (phase clocks, 2026-12-04). g → −∞: the exp
/// overflows to inf and the quotient is −0.
__device__ __forceinline__ float silu_fast(float g) { return __fdividef(g, 1.f + __expf(-g)); }

/// Sum over the block, returned to every thread. `scratch`: 32 floats of shared memory.
/// blockDim.x must be a multiple of 32. Safe to call repeatedly with the same scratch.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.f;
  return warp_sum(v);
}

/// Inclusive prefix sum over the block in thread order; `total` gets the block sum.
/// `scratch`: 32 floats of shared memory. blockDim.x must be a multiple of 32.
template <typename T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* scratch, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += up;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nwarps ? scratch[lane] : T(0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T up = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += up;
    }
    if (lane < nwarps) scratch[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += scratch[warp - 1];
  *total = scratch[nwarps - 1];
  return v;
}

/// 8 bf16 held in 16 bytes, as floats.
__device__ __forceinline__ void unpack8(const uint4& u, float out[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

/// Loads 8 consecutive bf16 (16 bytes, must be 16-byte aligned) as floats. One 16-byte load:
/// the copy into a local matters — unpack8 bound to the memory itself reads it as four 4-byte
/// loads (ld.v2.u16), four times the load instructions and L1 wavefronts.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float out[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  unpack8(u, out);
}

/// Stores 8 floats as 8 consecutive bf16 (16 bytes, 16-byte aligned), round to nearest.
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float in[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

/// 16-byte global → shared copy that bypasses registers (cp.async); src_bytes 0 writes zeros and
/// reads nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/// 4-byte cp.async (through L1); src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/// Closes the group of cp.async issued since the last commit (an empty group is allowed).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N committed cp.async groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Named barrier `kId` (1..15; 0 is __syncthreads') for kCount threads, whole warps: a
/// warp-specialized kernel's consumers meet without its producer.
template <int kId, int kCount>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

}  // namespace moebatch::kernels
