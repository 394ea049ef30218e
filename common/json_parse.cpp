#include "common/json_parse.h"

#include "common/utf8.h"

namespace moebatch {

nlohmann::json parse_json_bounded(std::string_view text, std::string* problem) {
  bool too_deep = false;
  const nlohmann::json::parser_callback_t check =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& /*parsed*/) {
        if (!json_too_deep(depth, event)) return true;
        too_deep = true;
        return false;  // the deep value is skipped, not built
      };
  nlohmann::json j;
  std::string found;
  try {
    j = nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond double ("1e999": 406, number overflow)
    found = std::string("not valid JSON (") + e.what() + ")";
  }
  if (found.empty() && too_deep)
    found = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
  if (problem) *problem = found;
  return found.empty() ? j : nlohmann::json(nlohmann::json::value_t::discarded);
}

std::optional<std::string> json_string_field(const nlohmann::json& obj, std::string_view key,
                                             std::string fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars) {
  return utf8_excerpt(v.dump(), max_chars);
}

}  // namespace moebatch
