// How a StepBatch becomes forward calls: cut into chunks of at most the token capacity, runs of
// consecutive positions of one sequence turned into attention sequences (the kernels' contract),
// and decode chunks padded to a bucket so a few captured graphs cover every batch size.
// Built once per step on the calling thread; every rank reads the same chunks.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/cuda_model.h"

namespace moebatch {

/// Most split-K partitions of decode attention (sizes the workspace).
constexpr int kMaxAttnSplits = 16;

/// What shapes the chunks of a step.
struct ChunkLimits {
  int tokens = 0;         ///< token capacity of one forward call
  int max_num_seqs = 0;   ///< largest decode batch a graph covers (= logits rows capacity)
  int block_size = 16;    ///< tokens per KV block
  int scratch_block = 0;  ///< block id padded rows write to and read from
  int table_cap = 0;      ///< blocks of one max_model_len sequence
  int num_kv_heads = 0;   ///< local kv heads (the same on every rank)
  int num_sms = 0;        ///< SMs of the device (sets the decode split count)
  int min_split_keys = 32;  ///< CudaBackendOptions::decode_attention_min_split_keys
};

/// One forward call's host-side inputs and shape.
struct StepChunk {
  std::vector<int32_t> tokens, positions, slots, q_start, kv_lens, tables, logits_rows;
  /// Recurrent-state slot of each attention sequence (−1 for padding); empty without state.
  std::vector<int32_t> state_slots;
  std::vector<int32_t> out_rows;  ///< output row (index into StepBatch::logits_rows) of each row
  StepShape shape;                ///< bounds of the call
  bool decode_graph = false;      ///< padded decode step: may replay a captured graph
  std::pair<int, int> key;        ///< (batch bucket, kv bucket) of the graph
};

/// Cuts a validated batch into chunks of at most lim.tokens tokens (tokens of one sequence keep
/// position order, so a later chunk attends to k/v an earlier one wrote).
std::vector<StepChunk> prepare_chunks(const StepBatch& b, const ChunkLimits& lim);

}  // namespace moebatch
