// The CUDA/cuBLAS/NCCL members of the project's check-macro family (see common/error.h): each
// throws moebatch::Error naming the failed expression, file and line. Launchers use CUDA_CHECK_LAST
// right after a launch so a bad configuration surfaces at its call site, not at the next sync.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/error.h"

#define CUDA_CHECK(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t mb_cuda_err_ = (expr);                                              \
    if (mb_cuda_err_ != cudaSuccess)                                                      \
      ::moebatch::throw_check_failure(cudaGetErrorString(mb_cuda_err_), #expr, __FILE__, \
                                      __LINE__);                                          \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                      \
    const cublasStatus_t mb_cublas_st_ = (expr);                                            \
    if (mb_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::moebatch::throw_check_failure(cublasGetStatusString(mb_cublas_st_), #expr, __FILE__, \
                                      __LINE__);                                            \
  } while (0)

/// NCCL calls; expands where <nccl.h> is included (engine/cuda/nccl_comm.cpp), so this header
/// needs no NCCL to compile.
#define NCCL_CHECK(expr)                                                                  \
  do {                                                                                    \
    const ncclResult_t mb_nccl_res_ = (expr);                                             \
    if (mb_nccl_res_ != ncclSuccess)                                                      \
      ::moebatch::throw_check_failure(ncclGetErrorString(mb_nccl_res_), #expr, __FILE__, \
                                      __LINE__);                                          \
  } while (0)

/// Checks the launch that just happened (configuration errors, not asynchronous faults).
#define CUDA_CHECK_LAST() CUDA_CHECK(cudaGetLastError())

/// Grid size for `n` items in groups of `d`.
#define CEIL_DIV(n, d) (((n) + (d) - 1) / (d))

namespace moebatch::kernels {

/// Whether CUDA device `device` has compute capability 9.0 (Hopper): what the sm_90a kernels
/// and cuBLASLt's block-scaled FP8 GEMM need.
inline bool is_sm90_device(int device) {
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

/// Whether `ptr` may be read and written in 16-byte vectors (what the vectorized kernels check
/// of every operand before launching).
inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace moebatch::kernels
