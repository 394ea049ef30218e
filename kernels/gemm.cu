#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemm.cuh"

namespace moebatch::kernels {
namespace {

// One thread per 8 consecutive columns of one row.
__global__ void add_bias_kernel(bf16* out, const bf16* bias, int rows, int cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int groups = cols / 8;
  if (i >= static_cast<int64_t>(rows) * groups) return;
  const int c = static_cast<int>(i % groups) * 8;
  bf16* row = out + (i / groups) * cols;
  float v[8], b[8];
  load8(row + c, v);
  load8(bias + c, b);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] += b[j];
  store8(row + c, v);
}

// Row-major out[m, n] is column-major outᵀ [n, m]; outᵀ = W · xᵀ where the row-major W [n, k]
// buffer read column-major is Wᵀ (hence OP_T) and row-major x [m, k] read column-major is xᵀ.
void linear_impl(cublasHandle_t handle, cudaStream_t stream, void* out, cudaDataType_t out_type,
                 const bf16* x, const bf16* w, int m, int n, int k) {
  MB_CHECK(m >= 0 && n > 0 && k > 0, "linear: bad shape");
  MB_CHECK(out && x && w, "linear: null operand");
  if (m == 0) return;
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k,
                            x, CUDA_R_16BF, k, &beta, out, out_type, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void linear(cublasHandle_t handle, cudaStream_t stream, bf16* out, const bf16* x, const bf16* w,
            int m, int n, int k) {
  linear_impl(handle, stream, out, CUDA_R_16BF, x, w, m, n, k);
}

void linear(cublasHandle_t handle, cudaStream_t stream, float* out, const bf16* x, const bf16* w,
            int m, int n, int k) {
  linear_impl(handle, stream, out, CUDA_R_32F, x, w, m, n, k);
}

void add_bias(bf16* out, const bf16* bias, int rows, int cols, cudaStream_t stream) {
  MB_CHECK(rows >= 0 && cols > 0 && cols % 8 == 0, "add_bias: cols must be a positive multiple of 8");
  MB_CHECK(out && bias, "add_bias: null operand");
  if (rows == 0) return;
  const int64_t threads = static_cast<int64_t>(rows) * (cols / 8);
  add_bias_kernel<<<static_cast<unsigned>(CEIL_DIV(threads, 256)), 256, 0, stream>>>(out, bias, rows, cols);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
