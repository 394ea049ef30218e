// Weight arena and step-buffer layout of the CUDA backend (engine/cuda/device_memory.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/cuda/cuda_model.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

namespace moebatch {

/// Bytes of the bf16 weight arena for `plan` (tied embeddings on one rank share the table).
size_t weight_bytes(const ModelConfig& cfg, const ShardDims& d, const ModelPlan& plan);

/// Lays the plan's tensors out in the arena at `base` (weight_bytes(...) bytes) and returns the
/// views; checks that wq/wk/wv (and their biases) are packed back to back.
DeviceModelWeights place_weights(const ModelConfig& cfg, const ShardDims& d,
                                 const ModelPlan& plan, void* base);

/// Fills placed weights from a checkpoint through read_plan_bf16 (shapes, dtypes and FP8
/// dequantization checked there).
void load_weights_device(const Checkpoint& ckpt, const ModelConfig& cfg, const ModelPlan& plan,
                         DeviceModelWeights& w, cudaStream_t stream);

/// Fills placed weights with seeded uniform values on the GPU (benchmarks: no checkpoint).
void random_weights_device(uint64_t seed, DeviceModelWeights& w, cudaStream_t stream);

}  // namespace moebatch
