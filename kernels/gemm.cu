#include "kernels/cuda_check.cuh"
#include "kernels/gemm.cuh"

namespace moebatch::kernels {
namespace {

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

}  // namespace moebatch::kernels
