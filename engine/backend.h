// The boundary between the Engine (scheduling, sampling, bookkeeping) and a compute backend
// (CPU fp32 reference now, CUDA later). The Engine builds a flat StepBatch in the layouts of
// docs/design.md; a backend owns its weights and KV cache storage and returns logits.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_config.h"

namespace moebatch {

/// One forward step: tokens of several sequences (prefill chunks and decode tokens together).
struct StepBatch {
  std::vector<int32_t> tokens;        ///< [n] token ids
  std::vector<int32_t> positions;     ///< [n] position of each token in its sequence
  std::vector<int32_t> seq_index;     ///< [n] row of block_tables for each token
  std::vector<int32_t> slot_mapping;  ///< [n] KV cache slot (block * block_size + offset)
  std::vector<int32_t> block_tables;  ///< [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;     ///< row width of block_tables
  std::vector<int32_t> logits_rows;   ///< token indices whose logits are returned, in order
};

/// A model on some device. Not thread-safe: one step at a time, driven by the engine thread.
class Backend {
 public:
  virtual ~Backend() = default;
  /// The model's hyper-parameters.
  virtual const ModelConfig& config() const = 0;
  /// KV cache capacity in blocks (every rank holds the same block ids).
  virtual int64_t num_kv_blocks() const = 0;
  /// Tokens per KV block.
  virtual int64_t block_size() const = 0;
  /// Runs the model: writes k/v of every token into its slot, attends causally over each
  /// sequence's cached positions 0..position, and fills `logits` with
  /// [logits_rows.size(), vocab] float32 values.
  virtual void forward(const StepBatch& batch, std::vector<float>& logits) = 0;
};

}  // namespace moebatch
