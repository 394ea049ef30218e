#include "kernels/cuda_check.cuh"
#include "kernels/kv_cache.cuh"
#include "kernels/launch.cuh"

namespace moebatch::kernels {
namespace {

// One block per token; 16-byte copies of the k row then the v row.
__global__ void kv_cache_write_kernel(KvCacheWriteParams p) {
  pdl_sync();
  const int t = blockIdx.x;
  const int slot = p.slot_mapping[t];
  if (slot < 0) return;
  const int width = p.n_kv_heads * p.head_dim;
  const size_t dst = static_cast<size_t>(slot) * width;  // size_t: slot*width overflows int
  const uint4* k = reinterpret_cast<const uint4*>(p.k + t * p.k_stride);
  const uint4* v = reinterpret_cast<const uint4*>(p.v + t * p.v_stride);
  uint4* kc = reinterpret_cast<uint4*>(p.k_cache + dst);
  uint4* vc = reinterpret_cast<uint4*>(p.v_cache + dst);
  for (int i = threadIdx.x; i < width / 8; i += blockDim.x) {
    kc[i] = k[i];
    vc[i] = v[i];
  }
}

}  // namespace

void kv_cache_write(const KvCacheWriteParams& p, cudaStream_t stream) {
  const int width = p.n_kv_heads * p.head_dim;
  MB_CHECK(width > 0 && width % 8 == 0, "kv_cache_write: n_kv_heads*head_dim must be a multiple of 8");
  MB_CHECK(p.k_stride % 8 == 0 && p.v_stride % 8 == 0 && p.k_stride >= width && p.v_stride >= width,
           "kv_cache_write: strides must be multiples of 8 and cover the row");
  MB_CHECK(p.k_cache && p.v_cache && p.k && p.v && p.slot_mapping, "kv_cache_write: null operand");
  if (p.tokens == 0) return;
  const int threads = width / 8 >= 128 ? 128 : 32 * CEIL_DIV(width / 8, 32);
  launch_dependent(kv_cache_write_kernel, p.tokens, threads, 0, stream, p);
  CUDA_CHECK_LAST();
}

}  // namespace moebatch::kernels
