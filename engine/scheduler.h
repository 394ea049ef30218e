// Continuous batching over a fixed number of slots: admit waiting requests into free slots
// (reserving KV blocks for prompt + max_tokens, so a running sequence never runs out of cache),
// then build one StepBatch of decode tokens first and prefill chunks in the remaining token
// budget. Finished sequences free their slot and blocks for the next step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"

namespace moebatch {

using SteadyClock = std::chrono::steady_clock;

/// A generation request as the engine receives it.
struct Request {
  uint64_t id = 0;              ///< caller's id, returned with the result
  std::vector<int32_t> prompt;  ///< token ids (non-empty)
  GenerationParams sampling;      ///< how to sample and when to stop
  bool keep_logits = false;     ///< return the logits row of every sampled step (tests, debug)
};

/// Why a sequence ended.
enum class FinishReason { Stop, Length };

/// One sequence's state while it lives in a slot.
struct Sequence {
  Request req;                               ///< the request
  std::vector<int32_t> tokens;               ///< prompt followed by generated tokens
  int64_t num_computed = 0;                  ///< tokens whose k/v are in the cache
  std::vector<int32_t> block_table;          ///< reserved KV blocks
  std::mt19937_64 rng;                       ///< this request's sampler RNG
  std::vector<float> logits;                 ///< kept logits rows (keep_logits only)
  SteadyClock::time_point t_added, t_first_token;  ///< timings
  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len(); }
};

/// What one step computes: the batch plus, per logits row, which sequence it samples for.
struct ScheduledStep {
  StepBatch batch;                     ///< input for Backend::forward
  std::vector<Sequence*> samples_for;  ///< one per logits row
};

/// Slot and token-budget bookkeeping.
class Scheduler {
 public:
  /// `max_num_seqs` slots, at most `max_num_batched_tokens` tokens per step.
  Scheduler(int64_t max_num_seqs, int64_t max_num_batched_tokens, BlockManager& blocks);

  /// Queues a validated request.
  void add(std::unique_ptr<Sequence> seq);
  /// Admits waiting sequences into free slots and builds the next step; empty batch when idle.
  ScheduledStep schedule();
  /// Frees `seq`'s slot and blocks and hands ownership back.
  std::unique_ptr<Sequence> finish(Sequence* seq);
  /// True when nothing is waiting or running.
  bool idle() const { return waiting_.empty() && running_.empty(); }
  /// Sequences occupying slots now.
  size_t num_running() const { return running_.size(); }

 private:
  int64_t max_num_seqs_, max_num_batched_tokens_;
  BlockManager& blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
};

}  // namespace moebatch
