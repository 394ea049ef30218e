// The JSON body of `POST /v1/batches` (docs/openai_api.md), read into the batch it asks for.
// Only the body: the handler (Service::batches_create) then looks the input file up and stores
// the batch. Kept apart from the handler so that tests and tests/fuzz/fuzz_batch_create.cpp
// reach it without a running service.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "queue/batch_store.h"

namespace moebatch {

/// The bounds of a batch's metadata, as OpenAI documents them (bytes here, so never more
/// characters than that).
inline constexpr size_t kMaxBatchMetadataPairs = 16;
inline constexpr size_t kMaxBatchMetadataKeyBytes = 64;
inline constexpr size_t kMaxBatchMetadataValueBytes = 512;

/// Why a body is refused: answered 400 in OpenAI's error shape.
struct BatchCreateError {
  std::string message;  ///< the reply's message
  std::string param;    ///< the field it names; empty when the body is not a JSON object
  std::string code;     ///< the reply's code; empty for most refusals
};

/// The body read strictly (duplicate keys and nesting past kMaxJsonDepth refused) into a batch
/// with input_file_id (non-empty), endpoint (/v1/chat/completions or /v1/completions),
/// completion_window ("24h") and metadata (a JSON object of at most 16 string values, when
/// given); everything else of the record is left at its default. Never throws on bad input.
std::variant<BatchRecord, BatchCreateError> parse_batch_create(std::string_view body);

}  // namespace moebatch
