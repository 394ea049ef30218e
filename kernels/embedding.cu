#include "kernels/cuda_check.cuh"
#include "kernels/embedding.cuh"
#include "kernels/launch.cuh"

namespace moebatch::kernels {
namespace {

// One block per token; 16-byte copies.
__global__ void embedding_gather_kernel(bf16* out, const bf16* table, const int32_t* ids,
                                        int hidden, int vocab) {
  pdl_sync();
  const int t = blockIdx.x;
  const int id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  // size_t: id * hidden overflows int for large vocabularies.
  const uint4* src = reinterpret_cast<const uint4*>(table + static_cast<size_t>(valid ? id : 0) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<size_t>(t) * hidden);
  for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x)
    dst[i] = valid ? src[i] : make_uint4(0, 0, 0, 0);
}

}  // namespace

void embedding_gather(bf16* out, const bf16* table, const int32_t* ids, int tokens, int hidden,
                      int vocab, cudaStream_t stream) {
  MB_CHECK(hidden > 0 && hidden % 8 == 0, "embedding_gather: hidden must be a positive multiple of 8");
  MB_CHECK(tokens >= 0 && vocab > 0, "embedding_gather: bad shape");
  if (tokens == 0) return;
  const int threads = hidden / 8 < 256 ? 32 * CEIL_DIV(hidden / 8, 32) : 256;
  launch_dependent(embedding_gather_kernel, tokens, threads, 0, stream, out, table, ids, hidden,
                   vocab);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
