#include "engine/cuda/memory_plan.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "engine/cuda/device_memory.h"

namespace moebatch {
namespace {

double gib(size_t b) { return static_cast<double>(b) / (1u << 30); }

struct Budget {
  size_t others = 0;  // memory other processes (and contexts) already hold
  double budget = 0;  // may be negative: then nothing fits
};

Budget budget_of(const DeviceNeeds& d, double util) {
  Budget b;
  b.others = d.total - d.free;
  b.budget = util * static_cast<double>(d.total) - static_cast<double>(b.others);
  return b;
}

std::string describe(const DeviceNeeds& d, const Budget& b, double util) {
  return fmt::format(
      "GPU memory plan on {}: {:.2f} GiB total, {:.2f} GiB in use by others, "
      "gpu_memory_utilization {:.2f} → budget {:.2f} GiB; weights {:.2f} GiB ({}) + activations "
      "{:.2f} GiB + state {:.2f} GiB + reserve {:.2f} GiB",
      d.device, gib(d.total), gib(b.others), util,
      gib(b.budget > 0 ? static_cast<size_t>(b.budget) : 0), gib(d.weights),
      describe_formats(d.weight_formats), gib(d.activations), gib(d.state), gib(d.reserve));
}

}  // namespace

std::vector<MemoryPlan> plan_device_memory(const std::vector<DeviceNeeds>& devices,
                                           const MemoryLimits& lim) {
  MB_CHECK(!devices.empty(), "memory plan: no device");
  const double util = lim.gpu_memory_utilization;
  const int64_t min_blocks = (lim.max_model_len + lim.block_size - 1) / lim.block_size;
  // Blocks each device can hold; the pool is the smallest (block ids are the same on all ranks).
  int64_t kv_blocks = std::numeric_limits<int64_t>::max();
  for (const DeviceNeeds& d : devices) {
    MB_CHECK(d.kv_block_bytes > 0, "memory plan: the model has no KV layer");
    const Budget b = budget_of(d, util);
    const size_t fixed = d.weights + d.activations + d.state + d.reserve;
    const size_t one_seq = static_cast<size_t>(min_blocks + 1) * d.kv_block_bytes;
    if (static_cast<double>(fixed + one_seq) > b.budget) {
      throw InputError(fmt::format(
          "out of GPU memory at start: {}; the KV cache needs {:.2f} GiB more for one sequence "
          "of max_model_len {} tokens. Raise gpu_memory_utilization, lower max_model_len or "
          "max_num_batched_tokens, or use more GPUs",
          describe(d, b, util), gib(one_seq), lim.max_model_len));
    }
    size_t kv = static_cast<size_t>(b.budget) - fixed;
    if (lim.max_kv_cache_bytes > 0) kv = std::min(kv, static_cast<size_t>(lim.max_kv_cache_bytes));
    const int64_t blocks = static_cast<int64_t>(kv / d.kv_block_bytes) - 1;
    if (blocks < min_blocks) {
      throw InputError(
          fmt::format("KV cache of {:.3f} GiB on {} holds {} blocks, fewer than one sequence of "
                      "max_model_len {} tokens needs ({} blocks)",
                      gib(kv), d.device, blocks, lim.max_model_len, min_blocks));
    }
    kv_blocks = std::min(kv_blocks, blocks);
  }
  std::vector<MemoryPlan> plans;
  for (const DeviceNeeds& d : devices) {
    const Budget b = budget_of(d, util);
    MemoryPlan p;
    p.device = d.device;
    p.total = d.total;
    p.free_at_start = d.free;
    p.budget = b.budget > 0 ? static_cast<size_t>(b.budget) : 0;
    p.weights = d.weights;
    p.weight_formats = d.weight_formats;
    p.activations = d.activations;
    p.state = d.state;
    p.reserve = d.reserve;
    p.kv_blocks = kv_blocks;
    p.kv = static_cast<size_t>(kv_blocks + 1) * d.kv_block_bytes;
    spdlog::info("{}; KV cache {:.2f} GiB = {} blocks x {} tokens ({} tokens)",
                 describe(d, b, util), gib(p.kv), p.kv_blocks, lim.block_size,
                 p.kv_blocks * lim.block_size);
    spdlog::info("{} weights: {}", d.device, describe_formats(d.weight_formats));
    plans.push_back(std::move(p));
  }
  return plans;
}

}  // namespace moebatch
