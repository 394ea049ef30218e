// The memory plan of the CUDA backend: how each device's budget splits into weights,
// activations, per-sequence state, a reserve and the paged KV pool (engine/cuda/memory_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/weights.h"

namespace moebatch {

/// Where one device's memory goes, decided once at start (bytes).
struct MemoryPlan {
  std::string device;        ///< "cuda:N"
  size_t total = 0;          ///< device memory
  size_t free_at_start = 0;  ///< free before this backend allocated anything
  size_t budget = 0;         ///< gpu_memory_utilization · total − memory others already use
  size_t weights = 0;        ///< weight arena
  std::vector<std::pair<WeightFormat, size_t>> weight_formats;  ///< the arena by format
  size_t activations = 0;                                       ///< step buffers
  size_t state = 0;       ///< per-sequence recurrent state slots (0 without linear attention)
  size_t reserve = 0;     ///< cuBLAS workspace, graphs, communicator buffers, allocator slack
  size_t kv = 0;          ///< KV pool, the scratch block included
  int64_t kv_blocks = 0;  ///< blocks the engine may use (one more is the padding scratch block)
};

/// What one device needs and has, measured or computed before anything is allocated.
struct DeviceNeeds {
  std::string device;                                           ///< "cuda:N"
  size_t total = 0;                                             ///< cudaMemGetInfo total
  size_t free = 0;                                              ///< cudaMemGetInfo free
  size_t weights = 0;                                           ///< weight arena bytes
  std::vector<std::pair<WeightFormat, size_t>> weight_formats;  ///< the arena by format
  size_t activations = 0;                                       ///< step_buffer_bytes
  size_t state = 0;           ///< state_bytes_per_seq · max_num_seqs
  size_t reserve = 0;         ///< fixed reserve
  size_t kv_block_bytes = 0;  ///< one KV block over this device's KV layers and heads
};

/// Limits from the backend's options.
struct MemoryLimits {
  double gpu_memory_utilization = 0.9;  ///< share of each device this process may use
  int64_t max_kv_cache_bytes = 0;       ///< cap on each device's KV pool (0: none)
  int64_t max_model_len = 0;            ///< one sequence of this many tokens must fit
  int64_t block_size = 16;              ///< tokens per KV block
};

/// Plans every device. Each device's KV pool gets what its budget leaves after weights,
/// activations, state and reserve; the block count is the smallest over devices, because block
/// ids are shared by every rank. InputError naming every number when one max_model_len sequence
/// does not fit on some device. Logs the plan.
std::vector<MemoryPlan> plan_device_memory(const std::vector<DeviceNeeds>& devices,
                                           const MemoryLimits& lim);

}  // namespace moebatch
