// The job model shared by the store, the ingress paths (CLI, ZeroMQ, direct SQL) and the
// dispatcher. Plain structs; validation lives in queue/job_validate.h, persistence in
// queue/job_store.h. Times are integer milliseconds since the Unix epoch, as in the schema.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moebatch {

/// Lifecycle: queued -> running -> done | failed | cancelled (running -> queued on retry/expiry).
enum class JobState { Queued, Running, Done, Failed, Cancelled };

/// "queued", "running", ... exactly as stored in jobs.state.
std::string_view job_state_to_string(JobState s);
/// Inverse of job_state_to_string; nullopt for anything else.
std::optional<JobState> job_state_from_string(std::string_view s);
/// True for done, failed and cancelled: no further transition is allowed.
bool job_state_is_final(JobState s);

/// How the prompt column is to be read: plain text, or a JSON array of chat messages.
enum class PromptKind { Text, Chat };

/// "text" or "chat".
std::string_view prompt_kind_to_string(PromptKind k);
/// Inverse of prompt_kind_to_string; nullopt for anything else.
std::optional<PromptKind> prompt_kind_from_string(std::string_view s);

/// Sampling parameters of one request (OpenAI names; top_k = 0 disables top-k).
struct SamplingParams {
  int64_t max_tokens = 256;       ///< generated-token budget, 1..limits.max_tokens
  double temperature = 1.0;       ///< 0 = greedy, up to 2
  double top_p = 1.0;             ///< nucleus mass in (0, 1]
  int64_t top_k = 0;              ///< 0 = disabled
  std::optional<int64_t> seed;    ///< nullopt = engine picks
  std::vector<std::string> stop;  ///< stop strings, at most limits.max_stop
};

/// What a producer submits. Everything but the prompt has a default.
struct JobSpec {
  std::optional<std::string> client_key;  ///< idempotency key: same key -> same job
  std::optional<std::string> batch_id;    ///< group id (one imported file, one client run)
  std::optional<std::string> custom_id;   ///< OpenAI Batch custom_id, echoed on export
  std::optional<std::string> model;       ///< model the request named (informative only)
  std::optional<std::string> user;        ///< OpenAI `user`: the end user (stored, informative)
  /// OpenAI `metadata`: a JSON object of up to 16 string values (stored, informative).
  std::optional<std::string> metadata;
  int64_t priority = 0;                   ///< higher runs first
  PromptKind prompt_kind = PromptKind::Text;
  std::string prompt;  ///< text, or JSON array of {role, content} objects
  /// Chat prompts: JSON object of chat template variables ({"enable_thinking": false});
  /// nullopt = the template's defaults.
  std::optional<std::string> chat_template_kwargs;
  SamplingParams sampling;
  int64_t max_attempts = 3;  ///< attempts before a retryable failure is final
};

/// Per-job timings, filled by the engine and written by JobStore::complete.
struct LatencyRecord {
  int64_t queue_wait_ms = 0;           ///< enqueued -> started (last attempt)
  std::optional<int64_t> ttft_ms;      ///< started -> first token
  std::optional<int64_t> decode_ms;    ///< first token -> last token
  int64_t total_ms = 0;                ///< enqueued -> finished
  std::optional<double> tokens_per_s;  ///< completion tokens / decode seconds
};

/// The outcome of a successful run.
struct JobResult {
  std::string text;                       ///< generated text
  int64_t prompt_tokens = 0;              ///< tokens in the rendered prompt
  int64_t completion_tokens = 0;          ///< tokens generated
  std::string finish_reason = "stop";     ///< "stop" | "length"
  std::optional<int64_t> first_token_at;  ///< absolute time of the first token, if known
};

/// One row of the jobs table.
struct Job {
  int64_t id = 0;                           ///< primary key
  JobSpec spec;                             ///< what was submitted
  JobState state = JobState::Queued;        ///< current state
  int64_t attempts = 0;                     ///< claims so far (a release gives one back)
  std::optional<std::string> lease_owner;   ///< worker holding the lease while running
  std::optional<int64_t> lease_expires_at;  ///< lease end while running
  /// Fencing token of the current (or last) lease: grows by one with every claim, so a write
  /// made under an older lease of the same job is refused even when the worker id matches.
  int64_t lease_token = 0;
  std::optional<std::string> error;         ///< last failure reason
  int64_t enqueued_at = 0;                  ///< insertion time
  int64_t not_before = 0;                   ///< earliest next claim (retry backoff)
  std::optional<int64_t> started_at;        ///< last claim time
  std::optional<int64_t> first_token_at;
  std::optional<int64_t> finished_at;  ///< time the final state was reached
  std::optional<JobResult> result;     ///< set when done
};

}  // namespace moebatch
