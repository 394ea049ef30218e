#include "queue/json_strict.h"

#include <set>
#include <vector>

#include "common/json_parse.h"
#include "common/utf8.h"

namespace moebatch {
namespace {

using nlohmann::json;

// Keys are quoted in messages with control bytes (NUL among them) made visible.
std::string printable_key(const std::string& key) {
  // At most 64 bytes, whole characters: the message goes into JSON replies and rows.
  const std::string head = utf8_prefix(key, 64);
  std::string out;
  for (char c : head) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    } else {
      out.push_back(c);
    }
  }
  return head.size() < key.size() ? out + "..." : out;
}

}  // namespace

json parse_json_strict(std::string_view text, std::string* problem) {
  problem->clear();
  // One key set per open object; arrays push nothing because their elements have no keys.
  std::vector<std::set<std::string>> open;
  std::string found;
  bool too_deep = false;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (json_too_deep(depth, event)) {
      too_deep = true;
      return false;  // the deep value is skipped, not built
    }
    if (event == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == json::parse_event_t::key && found.empty() && !open.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (key.find('\0') != std::string::npos) {
        found = "key '" + printable_key(key) + "' holds a NUL byte";
      } else if (!open.back().insert(key).second) {
        found = "duplicate key '" + printable_key(key) + "'";
      }
    }
    return true;
  };
  json j = json::parse(text, check, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *problem = "not valid JSON";
    return j;
  }
  if (too_deep) found = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
  if (!found.empty()) {
    *problem = found;
    return json(json::value_t::discarded);
  }
  return j;
}

}  // namespace moebatch
