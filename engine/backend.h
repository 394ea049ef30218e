// The boundary between the Engine (scheduling, sampling, bookkeeping) and a compute backend
// (CPU fp32 reference now, CUDA later). The Engine builds a flat StepBatch in the layouts of
// docs/design.md; a backend owns its weights and KV cache storage and returns logits.
#pragma once

#include <cstdint>
#include <limits>
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

/// Sampling controls of one logits row for backends that sample on their device.
struct RowSampling {
  float temperature = 0.0f;  ///< <= 0: greedy
  int32_t top_k = 0;         ///< <= 0: no limit beyond the backend's candidate cap
  float top_p = 1.0f;        ///< nucleus mass
  uint64_t seed = 0;         ///< the request's seed
  uint64_t step = 0;         ///< tokens the sequence generated so far (draw counter)
};

/// Checks a batch against a KV cache of `num_blocks` blocks of `block_size` tokens before any
/// device work starts: array lengths, token ids, block ids, slots, and that each token's block
/// table covers its position (< max_model_len). Throws moebatch::Error naming the violation.
void validate_step_batch(const StepBatch& b, const ModelConfig& cfg, int64_t num_blocks,
                         int64_t block_size,
                         int64_t max_model_len = std::numeric_limits<int64_t>::max());

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
  /// True when forward_sample is implemented: the engine then asks for sampled tokens instead
  /// of copying [rows, vocab] logits to the host each step (unless a request keeps its logits).
  virtual bool samples_on_device() const { return false; }
  /// Runs the model like forward() and samples one token per logits row on the device with
  /// `rows[i]`'s controls (greedy rows give the argmax, ties to the lowest id). Backends without
  /// device sampling keep the default, which the engine never calls.
  virtual void forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                              std::vector<int32_t>& tokens) {
    (void)batch;
    (void)rows;
    (void)tokens;
  }
};

}  // namespace moebatch
