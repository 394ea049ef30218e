// Dense bf16 GEMM through cuBLAS for the projections and the lm_head: out = x · Wᵀ with
// row-major x [m, k] and W [n, k] (Hugging Face layout), fp32 accumulation.
#pragma once

#include <cublas_v2.h>

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// out [m, n] bf16 = x [m, k] · w [n, k]ᵀ. Binds `handle` to `stream`.
void linear(cublasHandle_t handle, cudaStream_t stream, bf16* out, const bf16* x, const bf16* w,
            int m, int n, int k);

/// Same with fp32 output (logits for the router and the sampler).
void linear(cublasHandle_t handle, cudaStream_t stream, float* out, const bf16* x, const bf16* w,
            int m, int n, int k);

/// Independent products out_i [m_i, n] = x_i [m_i, k] · W_iᵀ (bf16, one n and k for all) as one
/// cuBLAS grouped GEMM (cublasGemmGroupedBatchedEx): the experts of a many-token MoE layer in
/// one call instead of one launch each. `ptrs_host` (pinned, ≥ 3·count entries) stages the
/// pointer arrays that cuBLAS reads from `ptrs_dev` (device, same size); the host entries are
/// copied on `stream` and must stay unchanged until the stream has passed this call.
void linear_grouped(cublasHandle_t handle, cudaStream_t stream, bf16* const* outs, const bf16* const* xs,
                    const bf16* const* ws, const int* ms, int count, int n, int k, const void** ptrs_host,
                    const void** ptrs_dev);

/// out[r, c] = bf16(out[r, c] + bias[c]) for out [rows, cols] (the q/k/v bias of Qwen2-MoE,
/// added after the bf16 GEMM). cols % 8 == 0.
void add_bias(bf16* out, const bf16* bias, int rows, int cols, cudaStream_t stream);

}  // namespace moebatch::kernels
