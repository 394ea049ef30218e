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

/// Inputs per scale of a ggml integer format: 32 (Q8_0, Q4_K, Q5_K), 16 (Q6_K); 0 for others.
int ggml_subblock(DType t);

/// The integer form of `n` elements of ggml format `t` (Q8_0, Q4_K, Q5_K, Q6_K) without loss:
/// codes[i] (Q4_K 0..15, Q5_K 0..31, Q6_K −32..31, Q8_0 −128..127) and per `group` inputs a scale
/// and a min with element i = codes[i] · scales[i / group] − mins[i / group], the scale and min
/// being the fp32 products ggml forms (d · sc, dmin · m). `group` must divide ggml_subblock(t)
/// (a sub-block's scale is repeated over its groups).
void unpack_row(DType t, const std::byte* src, int64_t n, int group, int8_t* codes,
                float* scales, float* mins);

}  // namespace moebatch
