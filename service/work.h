// What crosses the thread boundary between the dispatcher (Asio thread, owns the job store) and
// the engine thread (owns the Engine). Free of queue headers and of all engine headers but the
// one-function stop-string interface: the two sides are compiled in different translation
// units, and these plain structs are the whole contract between them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/stop_strings.h"

namespace moebatch {

/// Names one claim of a job in this process: the engine's sequence id, and what results,
/// progress and cancellations are matched by. Never reused, so when a job's lease is lost and
/// the job is claimed here again, nothing meant for the old claim (a cancellation still on its
/// way to the engine thread, a late result) can touch the new one.
using Ticket = uint64_t;

/// One tokenized, validated job ready for the engine.
struct WorkItem {
  int64_t job_id = 0;                             ///< jobs.id
  Ticket ticket = 0;                              ///< this claim (set by the dispatcher)
  std::vector<int32_t> prompt;                    ///< rendered and tokenized prompt
  int64_t max_tokens = 1;                         ///< generated-token budget (>= 1)
  float temperature = 0.0f;                       ///< 0 = greedy
  float top_p = 1.0f;                             ///< nucleus mass in (0, 1]
  int64_t top_k = 0;                              ///< 0 = all
  uint64_t seed = 0;                              ///< sampler seed
  std::vector<int32_t> stop_ids;                  ///< end-of-sequence token ids
  std::shared_ptr<StopStrings> stop_strings;      ///< the job's stop strings (null: none)
  std::chrono::steady_clock::time_point claimed;  ///< when the dispatcher claimed the job
  bool stream = false;   ///< report generated tokens after every step (WorkProgress)
  int64_t priority = 0;  ///< the job's queue priority: higher overtakes in the hand-off
};

/// Tokens a streaming job generated since its last report, in order (the stop token, which
/// ends the sequence but is no text, is never among them). The engine thread reports them
/// after each step; the dispatcher decodes them into text deltas. A job's WorkResult may
/// arrive before its last progress: the result is complete, later progress is stale.
struct WorkProgress {
  int64_t job_id = 0;           ///< jobs.id
  Ticket ticket = 0;            ///< the claim it belongs to
  std::vector<int32_t> tokens;  ///< new tokens
};

/// How a job left the engine.
enum class WorkOutcome {
  Finished,  ///< generated to a stop token, a stop string or max_tokens
  Rejected,  ///< the engine refused the request (InputError): fail the job, not retryable
  Aborted,   ///< dropped unfinished (drain timeout, engine failure): give the job back
};

/// The engine thread's report on one WorkItem.
struct WorkResult {
  int64_t job_id = 0;  ///< jobs.id
  Ticket ticket = 0;   ///< the claim it belongs to
  WorkOutcome outcome = WorkOutcome::Finished;
  std::vector<int32_t> tokens;  ///< generated ids (a stop token included)
  bool hit_stop_token = false;   ///< ended on a stop id (the last token)
  bool hit_stop_string = false;  ///< ended when the text completed a stop string
  int64_t prompt_tokens = 0;    ///< prompt length
  double handoff_s = 0;         ///< claimed -> added to the engine
  double ttft_s = 0;            ///< added -> first token
  double total_s = 0;           ///< added -> finished
  std::string error;            ///< reason when Rejected or Aborted
};

}  // namespace moebatch
