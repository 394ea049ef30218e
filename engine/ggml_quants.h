// Decoding of ggml's block formats as GGUF files store them (Q8_0 and the k-quants Q4_K, Q5_K,
// Q6_K), with ggml's own fp32 arithmetic so a decoded weight equals what llama.cpp computes. The
// CPU backend decodes to fp32 on load; the GPU keeps the blocks and decodes inside its kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/safetensors.h"

namespace moebatch {

/// Decodes `n` elements (a multiple of t's block size) of format `t` from `src` into `dst`.
/// Plain dtypes (F32, F16, BF16) are widened as they are.
void dequantize_row(DType t, const std::byte* src, float* dst, int64_t n);

}  // namespace moebatch
