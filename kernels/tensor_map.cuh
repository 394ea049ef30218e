// TMA tensor maps for the wgmma kernels (host side): a row-major [rows, cols] matrix in global
// memory described as boxes of box_rows × 128 (or 64) bytes in the 128-byte (64-byte) swizzle
// that kernels/wgmma.cuh's descriptors read. The driver's encoder is reached through the runtime, so
// nothing links libcuda itself.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace moebatch::kernels {

/// Element type of a tensor map.
enum class TmaElement { U8, Bf16 };

/// The map of `base` [rows, cols] (row stride cols elements; cols · element bytes a multiple of
/// 16, base 16-byte aligned): boxes of 128 bytes of a row × box_rows rows, in the 128-byte
/// swizzle (kernels/wgmma.cuh); what lies past rows or cols reads as zeros. Error when the
/// driver refuses it.
CUtensorMap tensor_map_2d(const void* base, TmaElement element, int64_t rows, int64_t cols, int box_rows);

/// The map of bf16 `base` [outer, mid, 64 · inner_64] (strides: mid · inner, inner elements; base
/// 16-byte aligned): boxes of 64 inner elements (128 bytes) × 1 mid × box_outer outer rows, in
/// the 128-byte swizzle. The paged KV cache [slots, kv heads, head_dim] read one cache block of
/// one kv head at a time (kernels/attention_wgmma.cu). Error when the driver refuses it.
CUtensorMap tensor_map_3d_bf16(const void* base, int64_t outer, int64_t mid, int64_t inner, int box_outer);

}  // namespace moebatch::kernels
