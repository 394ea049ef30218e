// OpenAI-compatible request and response shapes as pure functions (no sockets, no store): a
// /v1/chat/completions or /v1/completions body becomes a JobSpec plus streaming options, or an
// ApiError naming the field; results become response bodies and server-sent-event chunks.
//
// Accepted fields. Both: model (must be the served model), temperature, top_p, top_k (-1 or 0
// = off), seed, stop (string or array), max_tokens, n (1), stream, stream_options
// ({include_usage}), user; presence_penalty / frequency_penalty only 0, logprobs only
// false/null, logit_bias only empty, response_format only {"type": "text"}. Chat: messages
// (system | developer | user | assistant; content a string or an array of text parts, an
// optional name), max_completion_tokens, chat_template_kwargs. Completions: prompt (a string or
// an array of one string), echo (false), best_of (1), suffix (null). Any other field is
// refused, as OpenAI does ("Unrecognized request argument supplied: X").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/tokenizer/chat_template.h"
#include "queue/job.h"
#include "queue/job_validate.h"

namespace moebatch {

/// Which endpoint a request came to.
enum class ApiKind {
  Chat,        ///< /v1/chat/completions
  Completion,  ///< /v1/completions
};

/// A request the API refuses, in OpenAI's error terms.
struct ApiError {
  int status = 400;                            ///< HTTP status
  std::string message;                         ///< what is wrong, naming the field
  std::string param;                           ///< the field, empty when none
  std::string code;                            ///< machine-readable code, empty when none
  std::string type = "invalid_request_error";  ///< OpenAI's error type
};

/// A 400 `invalid_request_error` naming `param`.
inline ApiError invalid_request(std::string message, std::string param = {},
                                std::string code = {}) {
  return {400, std::move(message), std::move(param), std::move(code), "invalid_request_error"};
}

/// A parsed, validated request.
struct ApiRequest {
  ApiKind kind = ApiKind::Chat;
  JobSpec spec;                       ///< prompt, sampling, model, template variables
  std::vector<ChatMessage> messages;  ///< chat: the messages as the template sees them
  ChatOptions chat_options;           ///< chat: from chat_template_kwargs
  bool max_tokens_given = false;      ///< false: the service fills in what the context leaves
  bool stream = false;                ///< answer as server-sent events
  bool include_usage = false;         ///< stream_options.include_usage
};

/// Parses and validates a request body (JSON text). `served_model` is the only model accepted.
std::variant<ApiRequest, ApiError> parse_api_request(ApiKind kind, std::string_view body,
                                                     const std::string& served_model,
                                                     const JobLimits& limits);

/// Chat template variables the bundled templates understand (`enable_thinking`), or the reason
/// ("chat_template_kwargs.KEY: ...") a key or value is not supported.
std::variant<ChatOptions, std::string> chat_options_from_kwargs(const nlohmann::json& kwargs);

/// A finished request's outcome, as the API reports it.
struct ApiResult {
  std::string text;               ///< generated text (stop strings cut)
  std::string finish_reason;      ///< "stop" | "length"
  int64_t prompt_tokens = 0;      ///< rendered prompt tokens
  int64_t completion_tokens = 0;  ///< generated tokens
};

/// Identity of one response, repeated in every chunk.
struct ApiResponseId {
  ApiKind kind = ApiKind::Chat;
  std::string id;       ///< "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  ///< seconds since the epoch
  std::string model;    ///< served model name
};

/// The non-streaming body: chat.completion or text_completion, with usage.
std::string render_response(const ApiResponseId& rid, const ApiResult& r);

/// One `data: {chunk}\n\n` event. Chat: the first chunk carries the role; `finish_reason` set
/// on the last. `with_usage`: the chunk carries "usage": null (include_usage was asked).
std::string render_chunk(const ApiResponseId& rid, std::string_view delta, bool first,
                         const std::optional<std::string>& finish_reason, bool with_usage);

/// The usage event sent before [DONE] when include_usage was asked (empty choices).
std::string render_usage_chunk(const ApiResponseId& rid, int64_t prompt_tokens,
                               int64_t completion_tokens);

/// An error event inside a stream: `data: {"error": {...}}\n\n`.
std::string render_stream_error(const ApiError& e);

/// The closing event, `data: [DONE]\n\n`.
std::string sse_done();

/// The GET /v1/models body: one model with its context length.
std::string render_models(const std::string& model, int64_t created, int64_t max_model_len);

/// The GET /v1/models/{id} body: the model object alone.
std::string render_model(const std::string& model, int64_t created, int64_t max_model_len);

/// The OpenAI error body of `e`.
std::string render_error(const ApiError& e);

}  // namespace moebatch
