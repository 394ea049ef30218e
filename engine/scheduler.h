// Continuous batching over a fixed number of slots, in nano-vllm's shape: schedule() admits
// waiting requests into free slots (reserving KV blocks for prompt + max_tokens, so a running
// sequence never runs out of cache) and builds one StepBatch of decode tokens first and prefill
// chunks in the remaining token budget; postprocess() is the one place that appends sampled
// tokens, checks stop conditions and finishes sequences; abort() drops a sequence at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "engine/stop_strings.h"

namespace moebatch {

using SteadyClock = std::chrono::steady_clock;

/// A generation request as the engine receives it.
struct Request {
  uint64_t id = 0;                            ///< caller's id, returned with the result
  std::vector<int32_t> prompt;                ///< token ids (non-empty)
  GenerationParams sampling;                  ///< how to sample and when to stop
  std::shared_ptr<StopStrings> stop_strings;  ///< stop-string watcher (null: none)
  bool keep_logits = false;  ///< return the logits row of every sampled step (tests, debug)
};

/// Why a sequence ended.
enum class FinishReason {
  StopToken,   ///< sampled one of stop_token_ids (the token is part of the output)
  StopString,  ///< the text completed a stop string (the caller cuts the text there)
  Length,      ///< generated max_tokens
};

/// One sequence's state while it lives in a slot.
struct Sequence {
  Request req;                                     ///< the request
  std::vector<int32_t> tokens;                     ///< prompt followed by generated tokens
  int64_t num_computed = 0;                        ///< tokens whose k/v are in the cache
  std::vector<int32_t> block_table;                ///< reserved KV blocks
  int32_t slot = -1;                               ///< slot index (also its state slot)
  std::vector<float> logits;                       ///< kept logits rows (keep_logits only)
  FinishReason reason = FinishReason::Length;      ///< set when it finishes
  SteadyClock::time_point t_added, t_first_token;  ///< timings
  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len(); }
};

/// What one step computes: the batch plus, per logits row, which sequence it samples for.
struct ScheduledStep {
  StepBatch batch;                     ///< input for the backend
  std::vector<Sequence*> samples_for;  ///< one per logits row
};

/// Slot, token-budget and stop bookkeeping.
class Scheduler {
 public:
  /// `max_num_seqs` slots, at most `max_num_batched_tokens` tokens per step.
  Scheduler(int64_t max_num_seqs, int64_t max_num_batched_tokens, BlockManager& blocks);

  /// Queues a validated request.
  void add(std::unique_ptr<Sequence> seq);
  /// Admits waiting sequences into free slots and builds the next step; empty batch when idle.
  ScheduledStep schedule();
  /// Appends `tokens[i]` (and `logits` row i when kept) to step.samples_for[i], checks stop
  /// token ids, stop strings and max_tokens, and returns the sequences that finished (their
  /// slots and blocks already free).
  std::vector<std::unique_ptr<Sequence>> postprocess(const ScheduledStep& step,
                                                     const std::vector<int32_t>& tokens,
                                                     const std::vector<float>* logits,
                                                     int64_t vocab);
  /// Drops request `id` whether waiting or running, freeing its slot and blocks now; false when
  /// the engine does not hold it.
  bool abort(uint64_t id);
  /// True when nothing is waiting or running.
  bool idle() const { return waiting_.empty() && running_.empty(); }
  /// Sequences occupying slots now.
  size_t num_running() const { return running_.size(); }
  /// Requests waiting for a slot.
  size_t num_waiting() const { return waiting_.size(); }

 private:
  std::unique_ptr<Sequence> finish(Sequence* seq);

  int64_t max_num_seqs_, max_num_batched_tokens_;
  BlockManager& blocks_;
  std::vector<int32_t> free_slots_;  // stack; lowest slot handed out first
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
};

}  // namespace moebatch
