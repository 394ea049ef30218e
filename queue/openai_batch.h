// OpenAI Batch API files: input JSONL lines {"custom_id","method","url","body"} become JobSpecs,
// finished jobs become output lines {"id","custom_id","response","error"}. Supports the
// /v1/chat/completions and /v1/completions endpoints; anything else is a clear error.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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

/// The client_key of a batch request: the batch id with each backslash doubled and each '/'
/// written as backslash-slash, then '/', then the custom_id. The first unescaped '/' ends the batch
/// id, so batch "x/y" with custom_id "z" and batch "x" with custom_id "y/z" get different keys; a
/// batch id without either character keeps the plain "<batch_id>/<custom_id>" of earlier releases.
std::string batch_client_key(std::string_view batch_id, std::string_view custom_id);

/// Parses one input line into a job of batch_id. Throws InputError "line N: field: reason".
/// The job's client_key is batch_client_key(batch_id, custom_id), so re-importing a file is
/// idempotent. Duplicate keys in any object, and max_tokens given twice (as max_tokens and
/// max_completion_tokens), are errors.
JobSpec parse_batch_line(std::string_view line, size_t line_no, const std::string& batch_id,
                         const JobLimits& limits);

/// The outcome of reading a whole file: every valid job, and one message per bad line.
struct BatchFile {
  std::vector<JobSpec> specs;       ///< valid requests in file order
  std::vector<std::string> errors;  ///< "path:line N: field: reason"; empty when all are valid
  size_t lines = 0;                 ///< non-blank lines read
};

/// Reads and validates every line (blank lines are skipped). Duplicate custom_ids are errors.
/// progress(bytes_read, total_bytes) is called periodically. Throws InputError only when the
/// file cannot be read at all or exceeds BatchFileLimits::max_lines.
BatchFile read_batch_file(const std::filesystem::path& path, const std::string& batch_id,
                          const JobLimits& limits, const BatchFileLimits& file_limits,
                          const std::function<void(size_t, size_t)>& progress = {});

/// The output line for a final job (done, failed or cancelled); throws Error otherwise.
nlohmann::json batch_output_line(const Job& job);

}  // namespace moebatch
