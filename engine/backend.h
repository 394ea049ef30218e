// The boundary between the Engine (scheduling, stop checks, bookkeeping) and a compute backend
// (the CPU fp32 reference, the CUDA engine). The Engine builds a flat StepBatch in the layouts of
// docs/design.md; a backend owns its weights, KV cache and state storage, runs the model and
// samples the next token of every logits row.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
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
  /// [num_seqs] per-sequence recurrent-state slot of each row (linear-attention models). A row
  /// whose first token is at position 0 starts a new sequence and the backend zeroes its slot;
  /// otherwise the row's tokens continue the state that slot holds.
  std::vector<int32_t> state_slots;
  std::vector<int32_t> logits_rows;  ///< token indices whose logits are sampled, in order
};

/// Sampling controls of one logits row.
struct RowSampling {
  float temperature = 0.0f;  ///< <= 0: greedy
  int32_t top_k = 0;         ///< <= 0: no limit beyond the backend's candidate cap
  float top_p = 1.0f;        ///< nucleus mass
  uint64_t seed = 0;         ///< the request's seed
  uint64_t step = 0;         ///< tokens the sequence generated so far (draw counter)
};

/// Memory one rank of a backend holds on its device (host memory for the CPU backend).
struct DeviceUsage {
  std::string device;            ///< "cuda:0", "cpu"
  int64_t weight_bytes = 0;      ///< weights as held (compressed formats at their stored size)
  int64_t kv_bytes = 0;          ///< paged KV cache
  int64_t state_bytes = 0;       ///< per-sequence recurrent state slots
  int64_t activation_bytes = 0;  ///< step buffers
  int64_t total_bytes = 0;       ///< the device's capacity (0 for host memory)
};

/// Capacities and memory of a built backend; the engine's scheduler and the service's intake
/// limits, start log and /metrics read them from here.
struct BackendInfo {
  std::string description;           ///< e.g. "cuda tp=2 on cuda:0,cuda:1"
  int64_t kv_blocks = 0;             ///< KV blocks the engine may hand out
  int64_t block_size = 0;            ///< tokens per KV block
  int64_t kv_bytes_per_token = 0;    ///< KV bytes of one token over all layers and ranks
  int64_t state_slots = 0;           ///< sequences that can hold recurrent state (0: no state)
  int64_t max_model_len = 0;         ///< longest sequence (prompt + generated) served
  std::vector<DeviceUsage> devices;  ///< one per tensor-parallel rank
  /// Tokens the KV cache holds over all sequences.
  int64_t kv_tokens() const { return kv_blocks * block_size; }
  /// Weight bytes summed over ranks.
  int64_t weight_bytes() const;
};

/// Checks a batch against a KV cache of `num_blocks` blocks of `block_size` tokens before any
/// device work starts: array lengths, token ids, block ids, slots, and that each token's block
/// table covers its position (< max_model_len). Throws moebatch::Error naming the violation.
void validate_step_batch(const StepBatch& b, const ModelConfig& cfg, int64_t num_blocks,
                         int64_t block_size,
                         int64_t max_model_len = std::numeric_limits<int64_t>::max());

/// Where each recurrent-state slot's sequence ended, so that a step continues a slot's state
/// only with the sequence that owns it. A row's tokens must be consecutive positions, adjacent
/// in the batch (the recurrence consumes them in order, and the CUDA kernels walk one run per
/// row); a row starting at position 0 starts a new sequence (there is no prefix caching), any
/// other must start where its slot ended; no two rows of a step share a slot.
class StateSlotTracker {
 public:
  explicit StateSlotTracker(int64_t slots = 0) : next_pos_(static_cast<size_t>(slots), 0) {}
  /// Checks `b` (Error naming the violation, nothing changed) and records where each row's slot
  /// now ends. Returns the slots whose sequence starts in this step (at position 0).
  std::vector<int32_t> advance(const StepBatch& b);

 private:
  std::vector<int64_t> next_pos_;  // per slot: the position its state continues at
};

/// Samples rows[i] from logits [rows.size(), vocab] on the host (greedy, or temperature with
/// top-k / top-p; the same draws as the GPU sampler).
void sample_rows_host(const std::vector<float>& logits, int64_t vocab,
                      const std::vector<RowSampling>& rows, std::vector<int32_t>& tokens);

/// A model on some device(s). Not thread-safe: one step at a time, driven by the engine thread.
class Backend {
 public:
  virtual ~Backend() = default;
  /// The model's hyper-parameters.
  virtual const ModelConfig& config() const = 0;
  /// Capacities and memory, fixed once the backend is built.
  virtual const BackendInfo& info() const = 0;
  /// Runs the model: writes k/v of every token into its slot, attends causally over each
  /// sequence's cached positions 0..position, and fills `logits` with
  /// [logits_rows.size(), vocab] float32 values.
  virtual void forward(const StepBatch& batch, std::vector<float>& logits) = 0;
  /// Runs the model and samples one token per logits row with `rows[i]`'s controls (greedy
  /// rows give the argmax, ties to the lowest id). When `logits` is not null it also receives
  /// the [rows, vocab] logits. The default runs forward() and samples on the host; a backend
  /// that samples on its device overrides it and returns only token ids.
  virtual void forward_sample(const StepBatch& batch, const std::vector<RowSampling>& rows,
                              std::vector<int32_t>& tokens, std::vector<float>* logits);
};

}  // namespace moebatch
