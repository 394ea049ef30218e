// One JSON body of `POST /v1/batches`, as the handler hands it to parse_batch_create
// (service/batch_create.*) once Boost.Beast has read the HTTP message. A refusal's 400 reply
// reads back with its message, param and code unchanged, and names a param unless the body is
// not a JSON object; an accepted batch has an input file, one of the two endpoints, the "24h"
// window and metadata within OpenAI's bounds (at most 16 string values, keys up to 64 and
// values up to 512 bytes), prints strictly, and written back as a body reads back the same.
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "queue/json_strict.h"
#include "service/batch_create.h"
#include "service/http_server.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using moebatch::BatchCreateError;
using moebatch::BatchRecord;
using nlohmann::json;

json optional_field(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

void check_error(const BatchCreateError& e) {
  if (e.message.empty()) __builtin_trap();
  const json r = json::parse(
      moebatch::json_error(400, e.message, "invalid_request_error", e.param, e.code).body, nullptr,
      false);
  if (r.is_discarded() || !r.contains("error")) __builtin_trap();
  const json& err = r["error"];
  if (err.value("message", json()) != e.message ||
      err.value("param", json()) != optional_field(e.param) ||
      err.value("code", json()) != optional_field(e.code))
    __builtin_trap();
}

void check_batch(const BatchRecord& b) {
  if (b.input_file_id.empty() || b.completion_window != "24h" ||
      (b.endpoint != "/v1/chat/completions" && b.endpoint != "/v1/completions"))
    __builtin_trap();
  // Only the request's fields are set; the store fills in the rest.
  if (!b.id.empty() || b.status != "validating" || b.total != 0 || b.errors || b.created_at != 0)
    __builtin_trap();
  json body = {{"input_file_id", b.input_file_id},
               {"endpoint", b.endpoint},
               {"completion_window", b.completion_window}};
  if (b.metadata) {
    const json m = moebatch::parse_json_bounded(*b.metadata);
    if (!m.is_object() || m.size() > moebatch::kMaxBatchMetadataPairs) __builtin_trap();
    for (const auto& [k, v] : m.items())
      if (k.size() > moebatch::kMaxBatchMetadataKeyBytes || !v.is_string() ||
          v.get_ref<const std::string&>().size() > moebatch::kMaxBatchMetadataValueBytes)
        __builtin_trap();
    body["metadata"] = m;
  }
  // Strict printing: what was accepted is UTF-8 throughout (the store and the replies quote it).
  const std::string text = body.dump();
  auto again = moebatch::parse_batch_create(text);
  const auto* b2 = std::get_if<BatchRecord>(&again);
  if (b2 == nullptr || b2->input_file_id != b.input_file_id || b2->endpoint != b.endpoint ||
      b2->completion_window != b.completion_window || b2->metadata != b.metadata)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = moebatch::fuzz::as_text(data, size);
  const auto parsed = moebatch::parse_batch_create(body);
  if (const auto* e = std::get_if<BatchCreateError>(&parsed)) {
    check_error(*e);
    // Only a body that is not a JSON object (strictly read) names no field, and a field named
    // "" (json_error prints an empty param as null).
    std::string problem;
    const json j = moebatch::parse_json_strict(body, &problem);
    if (e->param.empty() && problem.empty() && j.is_object() && !j.contains("")) __builtin_trap();
    return 0;
  }
  check_batch(std::get<BatchRecord>(parsed));
  return 0;
}
