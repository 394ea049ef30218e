// Random weight matrices in each weight format for the weight-taking op cases (linear, expert
// GEMM, dequantize): host bytes in the device layout of kernels/weight_codec.cuh, uploaded once,
// and the decoded value of every element for the fp64 references (decoded from the same bytes
// by the engine's host decoder packed_value, so a kernel that decodes differently fails its check).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/packed_weights.h"
#include "kernels/weight_codec.cuh"
#include "tests/gpu/ops/op_case.h"
#include "tests/gpu/ops/op_util.h"

namespace moebatch::ops {

/// The kernel codec of a case's format.
kernels::WeightCodec codec_of(WeightFormat f);

/// A [rows, cols] matrix (stacked experts: rows = E · rows per expert) whose decoded values are
/// spread over about ±scale. cols must be a multiple of 32 (16 for bf16 and fp8); fp8 uses
/// scale groups of 128 inputs with a partial last group when cols % 128 != 0.
class RandomQuantMatrix {
 public:
  RandomQuantMatrix() = default;
  RandomQuantMatrix(WeightFormat f, int64_t rows, int64_t cols, float scale, std::mt19937& rng);
  /// The device matrix as kernels take it.
  kernels::QuantMatrix view() const;
  WeightFormat format() const { return format_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  /// Decoded value of element (r, c), row scale included: what an exact kernel multiplies by.
  float value(int64_t r, int64_t c) const;
  /// Device bytes of the matrix (values, scales and row scales): what a GEMV must read.
  double bytes() const;

 private:
  WeightFormat format_ = WeightFormat::bf16;
  int64_t rows_ = 0, cols_ = 0;
  int group_ = 0;
  PackedHost m_;  // host bytes, layout of kernels/weight_codec.cuh
  DevBuf<uint8_t> d_data_, d_scales_;
  DevBuf<float> d_row_scales_, d_mins_;
};

}  // namespace moebatch::ops
