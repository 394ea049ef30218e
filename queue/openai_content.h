// OpenAI request-body pieces that the Batch JSONL importer (queue/openai_batch.cpp) and the
// HTTP API (service/openai_api.cpp) read alike, so that one request body means one job whichever
// way it arrives.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moebatch {

/// One request field at fault: its path ("messages[0].content[1].type") and the problem.
struct FieldError {
  std::string field, message;
};

/// "a string", "an integer", ... : a JSON value's type as an error message names it.
std::string json_type_name(const nlohmann::json& v);

/// A message's content as the text a text model sees: a string, or a non-empty array of
/// {"type": "text", "text": "..."} parts joined by newlines (as vLLM joins them). Images and
/// audio have nowhere to go in a text model. Throws FieldError naming `field` or a part of it.
std::string message_content_text(const nlohmann::json& content, const std::string& field);

}  // namespace moebatch
