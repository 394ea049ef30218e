// Weight arena and step-buffer layout of the CUDA backend (engine/cuda/device_memory.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/cuda_model.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace moebatch {

/// Size of one rank's weight arena and how it splits by storage format.
struct WeightArena {
  size_t bytes = 0;  ///< the whole arena (alignment padding counted with the tensor after it)
  std::vector<std::pair<WeightFormat, size_t>> formats;  ///< bytes per format, first-seen order
};

/// "56.87 GiB bf16" (or "40.10 GiB bf16 + 16.02 GiB fp8" once formats mix).
std::string describe_formats(const std::vector<std::pair<WeightFormat, size_t>>& formats);

/// The arena `plan` needs (tied embeddings on one rank share the table with the lm_head).
WeightArena weight_arena(const ModelConfig& cfg, const ShardDims& d, const ModelPlan& plan);

/// Lays the plan's tensors out in the arena at `base` (weight_arena(...).bytes bytes) in field
/// order, each in the format its plan assigns (assign_weight_formats), and returns the views.
DeviceModelWeights place_weights(const ModelConfig& cfg, const ShardDims& d, const ModelPlan& plan,
                                 void* base);

/// Fills placed weights from a checkpoint: bf16 tensors through read_plan_bf16 (shapes, dtypes
/// and decoding checked there), compressed ones with the checkpoint's bytes as they are
/// (read_plan_packed), or quantized on the GPU when the checkpoint stores them plain.
void load_weights_device(const WeightSource& ckpt, const ModelConfig& cfg, const ModelPlan& plan,
                         DeviceModelWeights& w, cudaStream_t stream);

/// Fills placed weights with seeded uniform values on the GPU (benchmarks: no checkpoint), as one
/// model: every hub tensor of the plan is generated whole from (seed, its name) by element index,
/// and each rank keeps its plan's slices of it, so a tensor-parallel shard holds exactly the
/// values of the single-rank model. Compressed tensors hold those values quantized on the GPU.
void random_weights_device(uint64_t seed, const ModelPlan& plan, DeviceModelWeights& w,
                           cudaStream_t stream);

}  // namespace moebatch
