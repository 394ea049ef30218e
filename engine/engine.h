// The Engine facade the service drives from one thread: add(request), step() → finished
// sequences, idle(). It owns the scheduler, block manager and sampler state and calls a Backend
// for the model math; it knows nothing of queues, databases or sockets.
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
  /// Runs one batched forward step and returns the sequences that finished in it.
  std::vector<FinishedSequence> step();
  /// True when no request is waiting or running.
  bool idle() const { return scheduler_.idle(); }
  /// Teacher-forced logits [T, vocab] of every position of `tokens` (requires idle()).
  std::vector<float> score(const std::vector<int32_t>& tokens);
  /// The backend's model config.
  const ModelConfig& config() const { return backend_->config(); }

 private:
  std::unique_ptr<Backend> backend_;
  BlockManager blocks_;
  Scheduler scheduler_;
  std::vector<float> logits_;
};

/// Drives `engine` until idle, collecting every finished sequence (tests, CLI).
std::vector<FinishedSequence> run_to_completion(Engine& engine);

}  // namespace moebatch
