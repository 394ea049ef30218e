// Validation of jobs, shared by every ingress path: JobStore::submit (CLI, ZeroMQ), the OpenAI
// Batch importer, and JobStore::claim for rows that external producers inserted with plain SQL.
// Problems are reported as "field: reason" so callers can prefix the line, row or frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/utf8.h"  // is_valid_utf8, which the checks here use
#include "queue/job.h"

namespace moebatch {

/// Size and range limits applied to every job, whichever way it arrived.
struct JobLimits {
  size_t max_prompt_bytes = 1 << 20;        ///< prompt text or chat JSON, bytes
  int64_t max_tokens = 32768;               ///< upper bound of sampling.max_tokens (lower bound 1)
  size_t max_stop = 8;                      ///< stop strings per job
  size_t max_stop_bytes = 256;              ///< bytes per stop string
  size_t max_chat_messages = 4096;          ///< messages per chat prompt
  size_t max_id_bytes = 256;                ///< client_key, batch_id, custom_id, model
  int64_t max_attempts = 100;               ///< upper bound of max_attempts (lower bound 1)
  int64_t max_abs_priority = 1000000;       ///< priority in [-max, max]
  size_t max_template_kwargs_bytes = 4096;  ///< chat_template_kwargs JSON, bytes
};

/// First problem with a chat prompt (a JSON array of {"role","content"} objects), or nullopt.
std::optional<std::string> find_chat_messages_error(std::string_view json, const JobLimits& limits);

/// First problem with an id-like field (client_key, batch_id, custom_id, model, user) as
/// "field: reason": empty, longer than limits.max_id_bytes, or not UTF-8; nullopt when fine.
std::optional<std::string> find_id_error(const char* field, std::string_view v,
                                         const JobLimits& limits);

/// First problem with a metadata object (JSON: at most 16 string values, keys <= 64 bytes,
/// values <= 512 bytes, as OpenAI bounds it), or nullopt.
std::optional<std::string> find_metadata_error(std::string_view json);

/// First problem with a job, as "field: reason", or nullopt when the job is acceptable.
std::optional<std::string> find_job_spec_error(const JobSpec& spec, const JobLimits& limits);

/// Throws InputError("invalid job: field: reason") when find_job_spec_error reports a problem.
void validate_job_spec(const JobSpec& spec, const JobLimits& limits);

}  // namespace moebatch
