#include "queue/openai_content.h"

namespace moebatch {

using nlohmann::json;

std::string json_type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

std::string message_content_text(const json& c, const std::string& field) {
  auto text_of = [](const json& v, const std::string& where) -> const std::string& {
    if (!v.is_string()) throw FieldError{where, "expected a string, got " + json_type_name(v)};
    return v.get_ref<const std::string&>();
  };
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) {
    throw FieldError{field,
                     "expected a string or an array of text parts, got " + json_type_name(c)};
  }
  if (c.empty()) throw FieldError{field, "must not be an empty array"};
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string where = field + "[" + std::to_string(i) + "]";
    const json& part = c[i];
    if (!part.is_object())
      throw FieldError{where, "expected an object, got " + json_type_name(part)};
    auto type = part.find("type");
    if (type == part.end()) throw FieldError{where + ".type", "missing"};
    if (const std::string& t = text_of(*type, where + ".type"); t != "text")
      throw FieldError{where + ".type", "'" + t + "' is not supported (text only)"};
    for (const auto& [k, v] : part.items()) {
      if (k != "type" && k != "text")
        throw FieldError{where + "." + k, "unknown field of a text part"};
    }
    auto t = part.find("text");
    if (t == part.end()) throw FieldError{where + ".text", "missing"};
    if (i > 0) text += "\n";
    text += text_of(*t, where + ".text");
  }
  return text;
}

}  // namespace moebatch
