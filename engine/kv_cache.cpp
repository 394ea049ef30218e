#include "engine/kv_cache.h"

#include "common/error.h"

namespace moebatch {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  MB_CHECK(num_blocks > 0 && num_blocks < (int64_t{1} << 30), "KV block count out of range");
  MB_CHECK(block_size > 0 && block_size <= 1024, "KV block size out of range");
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::vector<int32_t> BlockManager::allocate(int64_t tokens) {
  MB_CHECK(can_allocate(tokens), "not enough free KV blocks");
  std::vector<int32_t> table;
  for (int64_t i = blocks_for(tokens); i > 0; --i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return table;
}

void BlockManager::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

HostKvCache::HostKvCache(const std::vector<LayerKind>& layers, int64_t blocks, int64_t bs,
                         int64_t nkv, int64_t hd)
    : num_blocks(blocks), block_size(bs), num_kv_heads(nkv), head_dim(hd) {
  const auto n = static_cast<size_t>(blocks * bs * nkv * hd);
  k.resize(layers.size());
  v.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].has_kv()) continue;
    k[l].assign(n, 0.0f);
    v[l].assign(n, 0.0f);
  }
}

}  // namespace moebatch
