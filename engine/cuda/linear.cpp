#include "engine/cuda/linear.h"

#include <string>

#include "common/error.h"
#include "kernels/gemm.cuh"

namespace moebatch {
namespace {

[[noreturn]] void no_kernel(const char* op, WeightFormat f) {
  throw Error(std::string(op) + ": no CUDA kernel for weights stored as " + weight_format_name(f));
}

template <class Out>
void linear_any(const GemmContext& g, Out* out, const bf16* in, const DeviceTensor& w, int rows) {
  MB_CHECK(w.shape.size() == 2, "linear: weight must be [out, in]");
  const int n = static_cast<int>(w.shape[0]), k = static_cast<int>(w.shape[1]);
  switch (w.format) {
    case WeightFormat::Bf16:
      kernels::linear(g.cublas, g.stream, out, in, w.as_bf16(), rows, n, k);
      return;
    case WeightFormat::F32:
      break;
  }
  no_kernel("linear", w.format);
}

}  // namespace

void linear(const GemmContext& g, bf16* out, const bf16* in, const DeviceTensor& w, int rows) {
  linear_any(g, out, in, w, rows);
}

void linear(const GemmContext& g, float* out, const bf16* in, const DeviceTensor& w, int rows) {
  linear_any(g, out, in, w, rows);
}

void expert_gemm(kernels::MoeGemmParams p, const DeviceTensor& w, cudaStream_t stream) {
  MB_CHECK(w.shape.size() == 3 && w.shape[0] == p.num_experts &&
               w.shape[1] == (p.silu_gate_up ? 2 : 1) * p.n && w.shape[2] == p.k,
           "expert_gemm: weights must be [num_experts, n (2n with silu_gate_up), k]");
  switch (w.format) {
    case WeightFormat::Bf16:
      p.weight = w.as_bf16();
      kernels::moe_gemm(p, stream);
      return;
    case WeightFormat::F32:
      break;
  }
  no_kernel("expert_gemm", w.format);
}

}  // namespace moebatch
