// The one place an Engine is built: the CLI, the service, the benchmarks and the tests describe
// what they want in an EngineSpec and get the engine plus the facts about it (EngineInfo) that
// intake limits, start logs and /metrics need. Backend headers never include the Engine; this
// file is the only code that knows every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/packed_weights.h"
#include "engine/weights.h"

namespace moebatch {

/// What to build.
struct EngineSpec {
  /// Checkpoint directory (config.json + safetensors), or "random:<shape>" for seeded random
  /// weights of a named shape (engine/model_shapes.h; CUDA backend only).
  std::string model;
  std::string backend = "cpu";   ///< cpu | cuda
  int tensor_parallel_size = 1;  ///< ranks (CPU: threads; CUDA: one GPU each)
  ExpertSplit expert_split = ExpertSplit::Intermediate;  ///< MoE sharding across ranks
  EngineOptions scheduler;                               ///< slots and tokens per step
  int threads = 0;             ///< cpu: compute threads over all ranks (0 = all cores)
  int64_t kv_cache_bytes = 0;  ///< cpu: KV pool (0 = 256 MiB); cuda: cap (0 = what is left)
  double gpu_memory_utilization = 0.90;  ///< cuda: share of each GPU this process may use
  int64_t max_model_len = 0;  ///< longest sequence (0 = the model's max_position_embeddings)
  bool cuda_graphs = true;    ///< cuda: replay decode steps from captured graphs
  /// cuda, tensor_parallel_size > 1: a step longer than this (or an NCCL error) aborts the
  /// communicators and fails the engine (the service requeues and rebuilds) instead of hanging.
  double collective_timeout_s = 120.0;
  /// cuda, tensor_parallel_size > 1: small all-reduces through the in-process peer-to-peer
  /// all-reduce fused with the add + RMSNorm after them; false: NCCL for all (vLLM's
  /// --disable-custom-all-reduce).
  bool custom_all_reduce = true;
  uint64_t random_seed = 0;   ///< seed of "random:" weights
  /// cuda: compressed linear weights (auto keeps a checkpoint's FP8 / NVFP4 compressed; fp8 /
  /// nvfp4 also quantize bf16 ones on load, the way to get compressed random models). cpu:
  /// auto or none only (it computes in fp32 from the checkpoint's values).
  Quantization quantization = Quantization::Auto;
};

/// Facts about a built engine.
struct EngineInfo {
  std::string model;        ///< "qwen3_moe, 48 layers, 128 experts, hidden 2048, vocab ..."
  BackendInfo backend;      ///< devices, memory per device, KV capacity
  int64_t vocab_size = 0;   ///< model vocabulary
  int64_t max_context = 0;  ///< longest sequence the engine serves (prompt + generated)
  int64_t slots = 0;        ///< max_num_seqs
  /// One line for logs: model, backend and memory per device.
  std::string describe() const;
};

/// An engine and its facts.
struct BuiltEngine {
  std::unique_ptr<Engine> engine;  ///< ready to add() requests
  EngineInfo info;                 ///< about it
};

/// Builds the engine `spec` describes. InputError for bad specs, checkpoints, a backend this
/// build or machine lacks, or a memory plan that does not fit (before any model byte is read
/// where possible).
BuiltEngine make_engine(const EngineSpec& spec);

}  // namespace moebatch
