// Conversions at the two edges of the engine hand-off, on the dispatcher's side:
//  - prepare_work: a claimed Job → a tokenized, validated WorkItem, or the reason it cannot run
//    (that job then fails alone; nothing else is affected);
//  - make_completion: a finished WorkResult → the store's Completion (text with stop strings
//    applied, token counts, finish reason, latency record).
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "queue/job_store.h"
#include "service/work.h"

namespace moebatch {

class Tokenizer;

/// Limits a job must meet before it reaches the engine.
struct IntakeLimits {
  int64_t max_model_len = 0;      ///< prompt tokens + max_tokens at most
  int64_t max_prompt_tokens = 0;  ///< rendered prompt tokens at most
  int64_t vocab_size = 0;         ///< the model's vocabulary (every prompt id must be below)
};

/// What the dispatcher remembers about a job between claim and completion.
struct InFlightJob {
  int64_t enqueued_at = 0;                ///< jobs.enqueued_at
  int64_t started_at = 0;                 ///< jobs.started_at of this attempt
  std::vector<std::string> stop;          ///< stop strings, applied on the text
  std::optional<std::string> client_key;  ///< for the completion notice
  std::optional<std::string> batch_id;    ///< for the completion notice
  Ticket ticket = 0;                      ///< this claim's WorkItem::ticket
};

/// The WorkItem for `job`, or a reason ("field: problem") when it cannot run. Never throws:
/// whatever one job's input provokes (an Error from the tokenizer's regex included) becomes
/// that job's reason, so the rest of its claim group is unaffected.
std::variant<WorkItem, std::string> prepare_work(const Job& job, const Tokenizer& tokenizer,
                                                 const IntakeLimits& limits);

/// The store's Completion for a Finished result.
Completion make_completion(const WorkResult& result, const InFlightJob& job,
                           const Tokenizer& tokenizer);

}  // namespace moebatch
