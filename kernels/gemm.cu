#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemm.cuh"
#include "kernels/launch.cuh"

namespace moebatch::kernels {
namespace {

// One thread per 8 consecutive columns of one row.
__global__ void add_bias_kernel(bf16* out, const bf16* bias, int rows, int cols) {
  pdl_sync();
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

// Runs the handle's next calls on `stream`, binding it only when it is another one:
// cublasSetStream also resets the handle's workspace to cuBLAS's own pool, which would drop a
// workspace the owner set (a rank's fixed buffer, which keeps cuBLAS from allocating while a
// step is captured into a graph and which the rank's cuBLASLt calls share).
void bind_stream(cublasHandle_t handle, cudaStream_t stream) {
  cudaStream_t current = nullptr;
  CUBLAS_CHECK(cublasGetStream(handle, &current));
  if (current != stream) CUBLAS_CHECK(cublasSetStream(handle, stream));
}

// Row-major out[m, n] is column-major outᵀ [n, m]; outᵀ = W · xᵀ where the row-major W [n, k]
// buffer read column-major is Wᵀ (hence OP_T) and row-major x [m, k] read column-major is xᵀ.
void linear_impl(cublasHandle_t handle, cudaStream_t stream, void* out, cudaDataType_t out_type,
                 const bf16* x, const bf16* w, int m, int n, int k) {
  MB_CHECK(m >= 0 && n > 0 && k > 0, "linear: bad shape");
  MB_CHECK(out && x && w, "linear: null operand");
  if (m == 0) return;
  bind_stream(handle, stream);
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

void linear_grouped(cublasHandle_t handle, cudaStream_t stream, bf16* const* outs, const bf16* const* xs,
                    const bf16* const* ws, const int* ms, int count, int n, int k, const void** ptrs_host,
                    const void** ptrs_dev) {
  MB_CHECK(count >= 0 && n > 0 && k > 0, "linear_grouped: bad shape");
  MB_CHECK(ptrs_host && ptrs_dev, "linear_grouped: no pointer staging");
  if (count == 0) return;
  // Per group (one problem each), column-major as linear_impl: outᵀ [n, m_i] = W_i · x_iᵀ.
  std::vector<cublasOperation_t> ta(count, CUBLAS_OP_T), tb(count, CUBLAS_OP_N);
  std::vector<int> m_arr(count, n), n_arr(ms, ms + count), k_arr(count, k), ld_k(count, k), ld_n(count, n),
      sizes(count, 1);
  std::vector<float> alpha(count, 1.f), beta(count, 0.f);
  for (int i = 0; i < count; ++i) {
    MB_CHECK(ms[i] > 0 && outs[i] && xs[i] && ws[i], "linear_grouped: empty or null problem");
    ptrs_host[i] = ws[i];
    ptrs_host[count + i] = xs[i];
    ptrs_host[2 * count + i] = outs[i];
  }
  CUDA_CHECK(cudaMemcpyAsync(ptrs_dev, ptrs_host, 3 * count * sizeof(void*), cudaMemcpyHostToDevice, stream));
  bind_stream(handle, stream);
  CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      handle, ta.data(), tb.data(), m_arr.data(), n_arr.data(), k_arr.data(), alpha.data(), ptrs_dev, CUDA_R_16BF,
      ld_k.data(), ptrs_dev + count, CUDA_R_16BF, ld_k.data(), beta.data(),
      const_cast<void**>(ptrs_dev + 2 * count), CUDA_R_16BF, ld_n.data(),
      count, sizes.data(), CUBLAS_COMPUTE_32F));
}

void add_bias(bf16* out, const bf16* bias, int rows, int cols, cudaStream_t stream) {
  MB_CHECK(rows >= 0 && cols > 0 && cols % 8 == 0, "add_bias: cols must be a positive multiple of 8");
  MB_CHECK(out && bias, "add_bias: null operand");
  if (rows == 0) return;
  const int64_t threads = static_cast<int64_t>(rows) * (cols / 8);
  launch_dependent(add_bias_kernel, static_cast<unsigned>(CEIL_DIV(threads, 256)), 256, 0, stream,
                   out, bias, rows, cols);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
