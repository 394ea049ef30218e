// OpenAI Batch API files: input JSONL lines {"custom_id","method","url","body"} become JobSpecs,
// finished jobs become output lines {"id","custom_id","response","error"}. Supports the
// /v1/chat/completions and /v1/completions endpoints; anything else is a clear error.
//
// parse_batch_request is the one place that decides which request fields a batch line may
// carry (the CLI import, the HTTP /v1/batches path and `queue-demo` all go through it):
//   - honoured: model, messages (content a string or an array of text parts, joined by
//     newlines as vLLM joins them; an optional name) or prompt (a string or an array of one),
//     max_tokens / max_completion_tokens, temperature, top_p, top_k (-1 = off), seed, stop,
//     chat_template_kwargs; `user` and `metadata` are stored and returned, not used;
//   - accepted at their no-op value only (what SDKs send by default): n 1, stream false,
//     stream_options null, presence/frequency_penalty 0, logprobs false, top_logprobs 0,
//     logit_bias {}, response_format {"type":"text"}, store false, tools [], tool_choice
//     "none", parallel_tool_calls, service_tier, modalities ["text"]; completions: echo false,
//     best_of 1, suffix null; any field null means its default;
//   - anything else makes that line an error naming the line and the field.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "queue/job.h"
#include "queue/job_validate.h"

namespace moebatch {

/// Limits on an input file, on top of the per-job JobLimits.
struct BatchFileLimits {
  size_t max_line_bytes = 4u << 20;  ///< one request line
  size_t max_lines = 1000000;        ///< requests per file
  size_t max_errors = 50;            ///< errors collected before reading stops
};

/// A batch line that cannot run: where and why.
struct BatchLineError {
  size_t line = 0;                       ///< 1-based line number in the file
  std::string field;                     ///< "body.frequency_penalty", "custom_id", "line", ...
  std::string message;                   ///< the reason
  std::optional<std::string> custom_id;  ///< the line's custom_id, when it had a readable one
  /// "line N: field: reason"
  std::string text() const;
};

/// The client_key of a batch request: the batch id with each backslash doubled and each '/'
/// written as backslash-slash, then '/', then the custom_id. The first unescaped '/' ends the batch
/// id, so batch "x/y" with custom_id "z" and batch "x" with custom_id "y/z" get different keys; a
/// batch id without either character keeps the plain "<batch_id>/<custom_id>" of earlier releases.
std::string batch_client_key(std::string_view batch_id, std::string_view custom_id);

/// Maps one input line to a job of batch_id, or to the reason it cannot run (see the file
/// comment for the fields). The job's client_key is batch_client_key(batch_id, custom_id), so
/// re-importing a file is idempotent. Duplicate keys in any object, and max_tokens given twice
/// (as max_tokens and max_completion_tokens), are errors.
std::variant<JobSpec, BatchLineError> parse_batch_request(std::string_view line, size_t line_no,
                                                          const std::string& batch_id,
                                                          const JobLimits& limits);

/// parse_batch_request that throws InputError("line N: field: reason") for a bad line.
JobSpec parse_batch_line(std::string_view line, size_t line_no, const std::string& batch_id,
                         const JobLimits& limits);

/// The outcome of reading a whole file: every valid job, and one error per bad line.
struct BatchFile {
  std::vector<JobSpec> specs;          ///< valid requests in file order
  std::vector<size_t> spec_lines;      ///< the line number of each of specs
  std::vector<BatchLineError> errors;  ///< one per bad line; empty when all are valid
  size_t lines = 0;                    ///< non-blank lines read
  bool stopped_early = false;          ///< reading stopped at BatchFileLimits::max_errors
};

/// Reads and validates every line (blank lines are skipped). A custom_id that repeats an
/// earlier line's is an error of the later line. progress(bytes_read, total_bytes) is called
/// periodically. Throws InputError only when the file cannot be read at all or exceeds
/// BatchFileLimits::max_lines.
BatchFile read_batch_file(const std::filesystem::path& path, const std::string& batch_id,
                          const JobLimits& limits, const BatchFileLimits& file_limits,
                          const std::function<void(size_t, size_t)>& progress = {});

/// The output line for a final job (done, failed or cancelled); throws Error otherwise.
nlohmann::json batch_output_line(const Job& job);

/// The error-file line for a rejected input line, as OpenAI writes a request it answered with
/// 400: {"id","custom_id","response":{"status_code":400,"request_id":null,"body":{"error":
/// {"message","type":"invalid_request_error","param","code":"invalid_request","line"}}},
/// "error":null}.
nlohmann::json batch_error_line(const BatchLineError& error);

}  // namespace moebatch
