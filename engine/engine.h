// The Engine facade the service drives from one thread: add(request), step() → finished
// sequences, abort(id), idle(). It owns the scheduler and block manager and calls a Backend for
// the model math and sampling; it knows nothing of queues, databases or sockets. Engines are
// built by engine/factory.h.
#pragma once

#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/scheduler.h"

namespace moebatch {

/// Scheduler limits.
struct EngineOptions {
  int64_t max_num_seqs = 16;             ///< concurrent sequences (slots)
  int64_t max_num_batched_tokens = 512;  ///< tokens per step (prefill is chunked to fit)
};

/// A finished sequence with its timings.
struct FinishedSequence {
  uint64_t id = 0;              ///< Request::id
  std::vector<int32_t> tokens;  ///< generated tokens (prompt excluded; a stop token included)
  FinishReason reason = FinishReason::Length;  ///< why it ended
  int64_t prompt_tokens = 0;                   ///< prompt length
  double time_to_first_token_s = 0;            ///< from add() to the first sampled token
  double total_s = 0;                          ///< from add() to finish
  std::vector<float> logits;                   ///< [tokens.size(), vocab] when keep_logits
};

/// Continuous-batching generation over a Backend.
class Engine {
 public:
  /// Takes ownership of the backend.
  Engine(std::unique_ptr<Backend> backend, const EngineOptions& opts);

  /// Validates and queues a request (InputError: empty prompt, token id outside the vocab,
  /// bad sampling, longer than the model or the KV cache can ever hold).
  void add(Request req);
  /// One step: schedule, run the model and sample, then postprocess. Returns the sequences
  /// that finished in it.
  std::vector<FinishedSequence> step();
  /// Drops request `id` (waiting or running): its slot and KV blocks are free for the next
  /// step and it is never returned. False when the engine does not hold it.
  bool abort(uint64_t id) { return scheduler_.abort(id); }
  /// True when no request is waiting or running.
  bool idle() const { return scheduler_.idle(); }
  /// Sequences in slots now.
  size_t num_running() const { return scheduler_.num_running(); }
  /// Teacher-forced logits [T, vocab] of every position of `tokens` (requires idle()).
  std::vector<float> score(const std::vector<int32_t>& tokens);
  /// The backend's model config.
  const ModelConfig& config() const { return backend_->config(); }
  /// The backend's capacities and memory.
  const BackendInfo& backend_info() const { return backend_->info(); }

 private:
  std::unique_ptr<Backend> backend_;
  BlockManager blocks_;
  Scheduler scheduler_;
  std::vector<RowSampling> rows_;  // per-step scratch
  std::vector<int32_t> sampled_;
  std::vector<float> logits_;
};

/// Drives `engine` until idle, collecting every finished sequence (tests, CLI).
std::vector<FinishedSequence> run_to_completion(Engine& engine);

}  // namespace moebatch
