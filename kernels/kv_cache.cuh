// Paged KV cache write. Cache layout (docs/design.md): [num_blocks, block_size, n_kv_heads,
// head_dim] per layer for k and v; token t goes to slot_mapping[t] = block * block_size + offset,
// so its row starts at slot * n_kv_heads * head_dim whatever the block size.
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Operands of kv_cache_write.
struct KvCacheWriteParams {
  bf16* k_cache = nullptr;          ///< [num_blocks * block_size, n_kv_heads * head_dim]
  bf16* v_cache = nullptr;
  const bf16* k = nullptr;          ///< [tokens, k_stride]
  const bf16* v = nullptr;          ///< [tokens, v_stride]
  int64_t k_stride = 0;             ///< elements between tokens; multiple of 8
  int64_t v_stride = 0;
  const int32_t* slot_mapping = nullptr;  ///< [tokens]; a negative slot skips the token (padding)
  int tokens = 0;
  int n_kv_heads = 0;
  int head_dim = 0;                 ///< n_kv_heads * head_dim multiple of 8
};

/// Copies each token's k and v rows into its cache slot.
void kv_cache_write(const KvCacheWriteParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
