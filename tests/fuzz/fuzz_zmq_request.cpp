// One ZeroMQ request body as the ingress's socket thread decodes it before anything else
// (queue/zmq/protocol.*: size and nesting checks, strict JSON, version, command, every job
// validated as the store validates it): refused with a ProtocolException whose error reply is
// valid JSON echoing the request id, or accepted as a Request whose jobs survive the client's
// encoding (job_spec_to_json, what `moebatch submit --endpoint` sends) unchanged.
#include <nlohmann/json.hpp>

#include "queue/zmq/protocol.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace zi = moebatch::zmq_ingress;
using nlohmann::json;

void check_reply(const std::string& reply, const json& id) {
  const json r = json::parse(reply, nullptr, false);
  if (r.is_discarded() || !r.is_object() || r.value("v", 0) != zi::kProtocolVersion)
    __builtin_trap();
  // Ids are strings (valid UTF-8, so echoed as sent) or integers.
  if (r["id"] != id) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zi::ProtocolLimits limits;
  limits.max_request_bytes = 64 << 10;  // the fuzzer's -max_len; too_large is a size check
  json id = nullptr;
  zi::Request r;
  try {
    r = zi::parse_request(moebatch::fuzz::as_text(data, size), limits, &id);
  } catch (const zi::ProtocolException& e) {
    if (e.error().code.empty() || e.error().retryable) __builtin_trap();
    check_reply(zi::error_reply(id, e.error()), id);
    return 0;
  }
  check_reply(zi::ok_reply(r.id, {{"ids", json::array()}}), r.id);
  if (r.cmd != zi::Command::Submit) {
    if (!r.jobs.empty()) __builtin_trap();
    return 0;
  }
  if (r.jobs.empty() || r.jobs.size() > limits.max_jobs_per_message) __builtin_trap();
  for (const moebatch::JobSpec& spec : r.jobs) {
    const json sent = zi::job_spec_to_json(spec);
    const json again = zi::job_spec_to_json(
        zi::job_spec_from_json(json::parse(sent.dump()), "job", std::nullopt, limits.jobs));
    if (again != sent) __builtin_trap();
  }
  return 0;
}
