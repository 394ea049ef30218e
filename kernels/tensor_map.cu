#include "kernels/tensor_map.cuh"

#include <cudaTypedefs.h>

#include <string>

#include "kernels/cuda_check.cuh"

namespace moebatch::kernels {
namespace {

// The driver's entry point, looked up once: it is the same for the whole process.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    MB_CHECK(fn != nullptr && found == cudaDriverEntryPointSuccess,
             "tensor_map_2d: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap tensor_map_2d(const void* base, TmaElement element, int64_t rows, int64_t cols, int box_rows) {
  const int bytes = element == TmaElement::U8 ? 1 : 2;
  MB_CHECK(rows > 0 && cols > 0 && cols * bytes % 16 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0,
           "tensor_map_2d: rows must be 16-byte multiples at a 16-byte aligned base");
  MB_CHECK(box_rows > 0 && box_rows <= 256, "tensor_map_2d: a box holds 1..256 rows");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols * bytes)};  // bytes between rows
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / bytes), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encoder()(&map, element == TmaElement::U8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                               2, const_cast<void*>(base), dims, strides, box, element_strides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE,
                               CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MB_CHECK(r == CUDA_SUCCESS, "tensor_map_2d: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return map;
}

CUtensorMap tensor_map_3d_bf16(const void* base, int64_t outer, int64_t mid, int64_t inner, int box_outer) {
  MB_CHECK(outer > 0 && mid > 0 && inner > 0 && inner % 64 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0,
           "tensor_map_3d_bf16: rows must be 64-element multiples at a 16-byte aligned base");
  MB_CHECK(box_outer > 0 && box_outer <= 256, "tensor_map_3d_bf16: a box holds 1..256 outer rows");
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(mid), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(inner * 2), static_cast<cuuint64_t>(mid * inner * 2)};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
                               element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MB_CHECK(r == CUDA_SUCCESS, "tensor_map_3d_bf16: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return map;
}

}  // namespace moebatch::kernels
