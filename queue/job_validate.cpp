#include "queue/job_validate.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/utf8.h"
#include "queue/json_strict.h"

namespace moebatch {
namespace {

std::optional<std::string> check_id(const char* field, const std::optional<std::string>& v,
                                    const JobLimits& limits) {
  if (!v) return std::nullopt;
  return find_id_error(field, *v, limits);
}

std::optional<std::string> check_stop_strings(const std::vector<std::string>& stop,
                                              const JobLimits& limits) {
  if (stop.size() > limits.max_stop) {
    return "stop: " + std::to_string(stop.size()) + " strings exceeds the limit of " +
           std::to_string(limits.max_stop);
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    const std::string where = "stop[" + std::to_string(i) + "]: ";
    if (stop[i].empty()) return where + "must not be empty";
    if (stop[i].size() > limits.max_stop_bytes) {
      return where + std::to_string(stop[i].size()) + " bytes exceeds the limit of " +
             std::to_string(limits.max_stop_bytes);
    }
    if (!is_valid_utf8(stop[i])) return where + "not valid UTF-8";
  }
  return std::nullopt;
}

// Text from a prompt quoted in a message: the first 32 bytes (a prompt may hold a megabyte-long
// role or key, and the message goes back to the client or into the row).
std::string chat_field_excerpt(std::string_view v) { return utf8_excerpt(v, 32); }

// True when v, converted to the engine's float, is a normal (not 0, not subnormal) number.
bool float_is_normal(double v) { return std::fpclassify(static_cast<float>(v)) == FP_NORMAL; }

// std::to_string prints 1e-300 as "0.000000": the message must show the value that was refused.
std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::optional<std::string> find_id_error(const char* field, std::string_view v,
                                         const JobLimits& limits) {
  if (v.empty()) return std::string(field) + ": must not be empty (omit it instead)";
  if (v.size() > limits.max_id_bytes) {
    return std::string(field) + ": " + std::to_string(v.size()) + " bytes exceeds the limit of " +
           std::to_string(limits.max_id_bytes);
  }
  if (!is_valid_utf8(v)) return std::string(field) + ": not valid UTF-8";
  return std::nullopt;
}

std::optional<std::string> find_metadata_error(std::string_view json) {
  std::string problem;
  const nlohmann::json j = parse_json_strict(json, &problem);
  if (!problem.empty() && problem != "not valid JSON") return "metadata: " + problem;
  if (j.is_discarded() || !j.is_object()) return "metadata: must be a JSON object";
  // OpenAI's bounds: 16 pairs, keys up to 64 and values up to 512 characters.
  if (j.size() > 16) return "metadata: " + std::to_string(j.size()) + " keys exceeds 16";
  for (const auto& [k, v] : j.items()) {
    if (!is_valid_utf8(k)) return "metadata: a key is not valid UTF-8";
    if (k.size() > 64) return "metadata." + utf8_prefix(k, 64) + "...: key longer than 64 bytes";
    if (!v.is_string()) return "metadata." + k + ": must be a string";
    if (v.get_ref<const std::string&>().size() > 512) {
      return "metadata." + k + ": longer than 512 bytes";
    }
    if (!is_valid_utf8(v.get_ref<const std::string&>()))
      return "metadata." + k + ": not valid UTF-8";
  }
  return std::nullopt;
}

std::optional<std::string> find_chat_messages_error(std::string_view json,
                                                    const JobLimits& limits) {
  std::string problem;
  nlohmann::json j = parse_json_strict(json, &problem);
  if (j.is_discarded()) {
    if (problem == "not valid JSON") return "prompt: chat messages are not valid JSON";
    return "prompt: chat messages: " + problem;
  }
  if (!j.is_array()) return "prompt: chat messages must be a JSON array";
  if (j.empty()) return "prompt: chat messages must not be empty";
  if (j.size() > limits.max_chat_messages) {
    return "prompt: " + std::to_string(j.size()) + " chat messages exceeds the limit of " +
           std::to_string(limits.max_chat_messages);
  }
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const auto& m = j[i];
    if (!m.is_object()) return where + ": must be an object";
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content" && key != "name") {
        return where + "." + chat_field_excerpt(key) + ": unknown field";
      }
      (void)value;
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return where + ".role: missing or not a string";
    const auto& r = role->get_ref<const std::string&>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer") {
      return where + ".role: '" + chat_field_excerpt(r) +
             "' is not one of system|developer|user|assistant";
    }
    auto content = m.find("content");
    if (content == m.end() || !content->is_string()) {
      return where + ".content: missing or not a string";
    }
  }
  return std::nullopt;
}

std::optional<std::string> find_job_spec_error(const JobSpec& spec, const JobLimits& limits) {
  if (auto e = check_id("client_key", spec.client_key, limits)) return e;
  if (auto e = check_id("batch_id", spec.batch_id, limits)) return e;
  if (auto e = check_id("custom_id", spec.custom_id, limits)) return e;
  if (auto e = check_id("model", spec.model, limits)) return e;
  if (auto e = check_id("user", spec.user, limits)) return e;
  if (spec.metadata) {
    if (auto e = find_metadata_error(*spec.metadata)) return e;
  }
  if (spec.priority < -limits.max_abs_priority || spec.priority > limits.max_abs_priority) {
    return "priority: " + std::to_string(spec.priority) + " is outside [-" +
           std::to_string(limits.max_abs_priority) + ", " +
           std::to_string(limits.max_abs_priority) + "]";
  }
  if (spec.prompt.size() > limits.max_prompt_bytes) {
    return "prompt: " + std::to_string(spec.prompt.size()) + " bytes exceeds the limit of " +
           std::to_string(limits.max_prompt_bytes);
  }
  if (spec.prompt.empty()) return "prompt: must not be empty";
  if (!is_valid_utf8(spec.prompt)) return "prompt: not valid UTF-8";
  if (spec.prompt_kind == PromptKind::Chat) {
    if (auto e = find_chat_messages_error(spec.prompt, limits)) return e;
  }
  if (spec.chat_template_kwargs) {
    const std::string& kw = *spec.chat_template_kwargs;
    if (spec.prompt_kind != PromptKind::Chat) return "chat_template_kwargs: only for chat prompts";
    if (kw.size() > limits.max_template_kwargs_bytes) {
      return "chat_template_kwargs: " + std::to_string(kw.size()) + " bytes exceeds the limit of " +
             std::to_string(limits.max_template_kwargs_bytes);
    }
    std::string problem;
    const nlohmann::json j = parse_json_strict(kw, &problem);
    if (!problem.empty() && problem != "not valid JSON") return "chat_template_kwargs: " + problem;
    if (j.is_discarded() || !j.is_object()) return "chat_template_kwargs: must be a JSON object";
  }
  const SamplingParams& p = spec.sampling;
  if (p.max_tokens < 1 || p.max_tokens > limits.max_tokens) {
    return "max_tokens: " + std::to_string(p.max_tokens) + " is outside [1, " +
           std::to_string(limits.max_tokens) + "]";
  }
  // Written as negated ranges so NaN fails too.
  if (!(p.temperature >= 0.0 && p.temperature <= 2.0)) {
    return "temperature: " + std::to_string(p.temperature) + " is outside [0, 2]";
  }
  // The engine samples in float: a value that is positive here but 0 or subnormal there would
  // pass this check and fail (or silently turn greedy) in the engine, so the check is repeated
  // in the engine's precision.
  if (p.temperature > 0.0 && !float_is_normal(p.temperature)) {
    return "temperature: " + fmt_double(p.temperature) +
           " is too small to be represented (use 0 for greedy, or at least 1.2e-38)";
  }
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
    return "top_p: " + std::to_string(p.top_p) + " is outside (0, 1]";
  }
  if (!float_is_normal(p.top_p)) {
    return "top_p: " + fmt_double(p.top_p) + " is too small to be represented (at least 1.2e-38)";
  }
  if (p.top_k < 0 || p.top_k > 1000000) {
    return "top_k: " + std::to_string(p.top_k) + " is outside [0, 1000000]";
  }
  if (auto e = check_stop_strings(p.stop, limits)) return e;
  if (spec.max_attempts < 1 || spec.max_attempts > limits.max_attempts) {
    return "max_attempts: " + std::to_string(spec.max_attempts) + " is outside [1, " +
           std::to_string(limits.max_attempts) + "]";
  }
  return std::nullopt;
}

void validate_job_spec(const JobSpec& spec, const JobLimits& limits) {
  if (auto e = find_job_spec_error(spec, limits)) throw InputError("invalid job: " + *e);
}

}  // namespace moebatch
