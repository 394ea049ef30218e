// Paged KV cache bookkeeping shared by every backend, and the host-memory cache of the CPU
// backend. Layout (docs/design.md): per layer k, v [num_blocks, block_size, n_kv_heads, head_dim];
// a token's slot is block * block_size + offset.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_config.h"

namespace moebatch {

/// Hands out KV blocks from a free list. Block ids are the same on every rank and device.
class BlockManager {
 public:
  /// A pool of num_blocks blocks of block_size tokens.
  BlockManager(int64_t num_blocks, int64_t block_size);
  /// Blocks needed to hold `tokens` tokens.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  /// True when `tokens` more tokens' worth of blocks are free.
  bool can_allocate(int64_t tokens) const { return blocks_for(tokens) <= free_blocks(); }
  /// Takes blocks for `tokens` tokens (must fit) and returns them as a block table.
  std::vector<int32_t> allocate(int64_t tokens);
  /// Returns a block table's blocks to the pool and clears it.
  void release(std::vector<int32_t>& table);
  /// Free blocks now.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  /// Total blocks.
  int64_t num_blocks() const { return num_blocks_; }
  /// Tokens per block.
  int64_t block_size() const { return block_size_; }

 private:
  int64_t num_blocks_, block_size_;
  std::vector<int32_t> free_;  // stack; lowest ids handed out first
};

/// One rank's KV cache in host memory.
struct HostKvCache {
  int64_t num_blocks = 0;             ///< blocks per layer
  int64_t block_size = 0;             ///< tokens per block
  int64_t num_kv_heads = 0;           ///< local kv heads
  int64_t head_dim = 0;               ///< per-head width
  std::vector<std::vector<float>> k;  ///< per layer [num_blocks, block_size, nkv, hd]; empty
                                      ///< for layers without KV (linear attention)
  std::vector<std::vector<float>> v;  ///< per layer, same layout as k

  /// Allocates zeroed storage for the layers of `layers` that keep KV.
  HostKvCache(const std::vector<LayerKind>& layers, int64_t num_blocks, int64_t block_size,
              int64_t nkv, int64_t hd);
  /// Floats per slot (nkv * hd).
  int64_t slot_stride() const { return num_kv_heads * head_dim; }
};

}  // namespace moebatch
