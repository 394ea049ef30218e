// The ZeroMQ ingress protocol, version 1 (schemas/zmq-request.json, zmq-reply.json,
// zmq-notice.json; docs/zmq.md). A request is one JSON object
//   {"v": 1, "cmd": "submit"|"status"|"result"|"cancel"|"stats"|"batch_status"|"batch_cancel"|
//    "batch_retry"|"batch_purge"|"batch_results", "id": <request id>, ...}
// and every request gets exactly one reply echoing "id": {"v":1,"id":..,"ok":true,...} or
// {"v":1,"id":..,"ok":false,"error":{"code","message","field","retryable"}}.
//
// This file turns untrusted bytes into a validated Request or a ProtocolError; it owns no
// sockets and no store, so every rule here is testable without ZeroMQ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/json_parse.h"
#include "queue/job.h"
#include "queue/job_validate.h"

namespace moebatch::zmq_ingress {

/// The protocol version this build speaks.
inline constexpr int kProtocolVersion = 1;

/// Stable error codes carried in error replies (docs/zmq.md lists when each is sent).
namespace error_code {
inline constexpr std::string_view kBadFrames = "bad_frames";          ///< envelope not [id,(""),body]
inline constexpr std::string_view kTooLarge = "too_large";            ///< body over max_request_bytes
inline constexpr std::string_view kBadJson = "bad_json";              ///< not a JSON object
inline constexpr std::string_view kBadVersion = "bad_version";        ///< "v" missing or not 1
inline constexpr std::string_view kUnknownCommand = "unknown_command";  ///< "cmd" not known
inline constexpr std::string_view kInvalid = "invalid";               ///< a field breaks a rule
inline constexpr std::string_view kTooManyJobs = "too_many_jobs";     ///< over max_jobs_per_message
inline constexpr std::string_view kNotFound = "not_found";            ///< no such job
inline constexpr std::string_view kKeyConflict = "key_conflict";      ///< key names another payload
inline constexpr std::string_view kBusy = "busy";                     ///< saturated: retry later
inline constexpr std::string_view kInternal = "internal";             ///< our fault; retry later
}  // namespace error_code

/// A request that cannot be served, as sent back to the producer.
struct ProtocolError {
  std::string code;                  ///< one of error_code
  std::string message;               ///< human-readable reason
  std::optional<std::string> field;  ///< JSON path of the offending field ("jobs[2].top_p")
  bool retryable = false;            ///< true for busy/internal: the same request may succeed later
};

/// Thrown by the parsers below; carries the reply to send.
class ProtocolException : public InputError {
 public:
  /// Wraps err; what() is "code: message".
  explicit ProtocolException(ProtocolError err)
      : InputError(err.code + ": " + err.message), error_(std::move(err)) {}
  /// The structured error.
  const ProtocolError& error() const { return error_; }

 private:
  ProtocolError error_;
};

/// Request-level limits (transport limits live in IngressOptions).
struct ProtocolLimits {
  size_t max_request_bytes = 4u << 20;  ///< JSON body; larger gets too_large
  size_t max_jobs_per_message = 1000;   ///< jobs in one submit
  size_t max_request_id_bytes = 256;    ///< a string request id
  JobLimits jobs;                       ///< per-job limits, as the store applies them
};

/// batch_results: jobs per page at most and by default, and the output lines' bytes after
/// which a page ends early (at least one job always; replies stay far below the client's
/// 64 MiB ZMQ_MAXMSGSIZE).
inline constexpr int64_t kMaxResultsPage = 1000;
inline constexpr int64_t kDefaultResultsPage = 100;
inline constexpr size_t kResultsPageBytes = 4u << 20;

/// The commands of version 1.
enum class Command {
  Submit,
  Status,
  Result,
  Cancel,
  Stats,
  BatchStatus,   ///< counts of one batch's jobs by state, tokens
  BatchCancel,   ///< cancel the batch's queued and running jobs
  BatchRetry,    ///< requeue the batch's failed jobs
  BatchPurge,    ///< delete a finished batch's jobs
  BatchResults,  ///< one page of the batch's OpenAI output and error lines (export)
};

/// A parsed, validated request.
struct Request {
  nlohmann::json id;           ///< request id, echoed (string or integer)
  Command cmd = Command::Stats;
  std::vector<JobSpec> jobs;   ///< submit: validated jobs, in order
  bool single_job = false;     ///< submit: sent as "job" (object), not "jobs" (array)
  std::optional<int64_t> job_id;           ///< status/result/cancel by id
  std::optional<std::string> client_key;   ///< status/result/cancel by key
  std::string batch_id;                    ///< the batch_* commands
  int64_t after_id = 0;                    ///< batch_results: the page starts after this job
  int64_t limit = kDefaultResultsPage;     ///< batch_results: jobs in the page, 1..1000
};

/// Parses and validates one request body. Throws ProtocolException on any problem; the error's
/// `field` names the JSON path. The request id, when it was readable, is stored in *id_out even
/// on failure so the error reply can echo it.
Request parse_request(std::string_view body, const ProtocolLimits& limits,
                      nlohmann::json* id_out);

/// One job object of a submit ({"prompt": ...} or {"messages": [...]}, sampling fields, ...),
/// validated. default_batch applies when the job names no batch_id. path prefixes field names.
JobSpec job_spec_from_json(const nlohmann::json& j, const std::string& path,
                           const std::optional<std::string>& default_batch,
                           const JobLimits& limits);

/// The inverse of job_spec_from_json, used by the client.
nlohmann::json job_spec_to_json(const JobSpec& spec);

/// {"v":1,"id":id,"ok":true} merged with body's members.
std::string ok_reply(const nlohmann::json& id, nlohmann::json body);
/// {"v":1,"id":id,"ok":false,"error":{...}}.
std::string error_reply(const nlohmann::json& id, const ProtocolError& err);

/// The compact view of a job in status replies: no prompt, no result text.
nlohmann::json job_status_json(const Job& job);

}  // namespace moebatch::zmq_ingress
