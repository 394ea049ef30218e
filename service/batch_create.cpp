#include "service/batch_create.h"

#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "queue/json_strict.h"

namespace moebatch {

std::variant<BatchRecord, BatchCreateError> parse_batch_create(std::string_view body) {
  using nlohmann::json;
  std::string problem;
  const json j = parse_json_strict(body, &problem);
  if (!problem.empty() || !j.is_object()) {
    return BatchCreateError{problem.empty() ? "the request body must be a JSON object"
                                            : "the request body is refused: " + problem,
                            "", ""};
  }
  BatchRecord b;
  for (const auto& [k, v] : j.items()) {
    if (k == "input_file_id" && v.is_string()) {
      b.input_file_id = v.get<std::string>();
    } else if (k == "endpoint" && v.is_string()) {
      b.endpoint = v.get<std::string>();
    } else if (k == "completion_window" && v.is_string()) {
      b.completion_window = v.get<std::string>();
    } else if (k == "metadata" && (v.is_null() || v.is_object())) {
      if (v.is_null()) continue;
      bool ok = v.size() <= kMaxBatchMetadataPairs;
      for (const auto& [mk, mv] : v.items())
        ok = ok && mk.size() <= kMaxBatchMetadataKeyBytes && mv.is_string() &&
             mv.get_ref<const std::string&>().size() <= kMaxBatchMetadataValueBytes;
      if (!ok) {
        return BatchCreateError{
            "metadata: at most 16 string values, keys up to 64 and values up to 512 characters",
            "metadata", ""};
      }
      b.metadata = dump_json(v);
    } else {
      return BatchCreateError{k + ": unknown field or wrong type (input_file_id, endpoint, "
                                  "completion_window: strings; metadata: object)",
                              k, ""};
    }
  }
  if (b.input_file_id.empty()) {
    return BatchCreateError{"Missing required parameter: 'input_file_id'.", "input_file_id",
                            "missing_required_parameter"};
  }
  if (b.endpoint != "/v1/chat/completions" && b.endpoint != "/v1/completions")
    return BatchCreateError{"endpoint: must be /v1/chat/completions or /v1/completions", "endpoint",
                            ""};
  if (b.completion_window != "24h")
    return BatchCreateError{"completion_window: only '24h' is supported", "completion_window", ""};
  return b;
}

}  // namespace moebatch
