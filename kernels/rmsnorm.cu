#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/rmsnorm.cuh"

namespace moebatch::kernels {
namespace {

constexpr int kThreads = 256;

// One block per row. The second pass re-reads the row (the same thread's own writes, so no
// barrier is needed between the residual store and the reload); rows are L1/L2 resident.
template <bool kAdd>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(RmsNormParams p) {
  pdl_sync();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * p.cols;  // size_t: rows*cols overflows int
  const bf16* in = p.in + base;
  bf16* src = kAdd ? p.residual + base : const_cast<bf16*>(in);
  const int nvec = p.cols / 8;
  float ss = 0.f;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    float r[8];
    load8(src + 8 * i, r);
    if constexpr (kAdd) {
      float x[8];
      load8(in + 8 * i, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) r[j] = __bfloat162float(__float2bfloat16(r[j] + x[j]));
      store8(src + 8 * i, r);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += r[j] * r[j];
  }
  ss = block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / p.cols + p.eps);
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    float r[8], w[8];
    load8(src + 8 * i, r);
    load8(p.weight + 8 * i, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) r[j] = r[j] * rstd * (p.weight_offset + w[j]);
    store8(p.out + base + 8 * i, r);
  }
}

void check(const RmsNormParams& p, bool add) {
  MB_CHECK(p.cols > 0 && p.cols % 8 == 0, "rmsnorm: cols must be a positive multiple of 8");
  MB_CHECK(p.rows >= 0, "rmsnorm: rows must be >= 0");
  MB_CHECK(p.out && p.in && p.weight, "rmsnorm: null operand");
  MB_CHECK(!add || p.residual, "add_rmsnorm: residual is required");
}

}  // namespace

void rmsnorm(const RmsNormParams& p, cudaStream_t stream) {
  check(p, false);
  if (p.rows == 0) return;
  launch_dependent(rmsnorm_kernel<false>, p.rows, kThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

void add_rmsnorm(const RmsNormParams& p, cudaStream_t stream) {
  check(p, true);
  if (p.rows == 0) return;
  launch_dependent(rmsnorm_kernel<true>, p.rows, kThreads, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
