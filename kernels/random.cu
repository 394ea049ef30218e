#include "kernels/cuda_check.cuh"
#include "kernels/random.cuh"

namespace moebatch::kernels {
namespace {

__global__ void fill_uniform_kernel(bf16* x, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16((2.f * uniform01(seed, i) - 1.f) * scale);
}

}  // namespace

void fill_uniform(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  MB_CHECK(x != nullptr, "fill_uniform: null operand");
  const size_t blocks = CEIL_DIV(n, static_cast<size_t>(256));
  fill_uniform_kernel<<<static_cast<int>(blocks < 8192 ? blocks : 8192), 256, 0, stream>>>(x, n, seed, scale);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
