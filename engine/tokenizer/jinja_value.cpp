#include "engine/tokenizer/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "engine/tokenizer/jinja_strings.h"
#include "engine/tokenizer/utf8.h"

namespace moebatch::jinja {
namespace {

// Python raises RecursionError near 1000 frames; values nested deeper than this (a template can
// build them in a loop) are refused before the C++ stack is at risk.
constexpr int kMaxNesting = 512;

void check_depth(int depth) {
  if (depth > kMaxNesting) {
    throw InputError("value nested more than " + std::to_string(kMaxNesting) + " levels deep");
  }
}

std::string repr_at(const Value& v, int depth);

std::string repr_seq(const ListData& l, int depth) {
  std::string out(1, l.tuple ? '(' : '[');
  for (std::size_t i = 0; i < l.items.size(); ++i) {
    if (i > 0) out += ", ";
    out += repr_at(l.items[i], depth + 1);
  }
  if (l.tuple && l.items.size() == 1) out += ',';
  out += l.tuple ? ')' : ']';
  return out;
}

std::string repr_dict(const DictData& d, int depth) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.items()) {
    if (!first) out += ", ";
    first = false;
    out += repr_at(k, depth + 1) + ": " + repr_at(v, depth + 1);
  }
  return out + "}";
}

std::string repr_at(const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return py_float_repr(v.as_double());
    case Value::Kind::kString:
      return py_str_repr(v.as_string());
    case Value::Kind::kList:
      return repr_seq(v.as_list(), depth);
    case Value::Kind::kDict:
      return repr_dict(v.as_dict(), depth);
    case Value::Kind::kObject:
      return "<Namespace " + repr_dict(v.as_object().attrs, depth) + ">";
    case Value::Kind::kFunction:
      return "<function " + v.as_function().name + ">";
  }
  return "";
}

bool equals_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const ListData& x = a.as_list();
      const ListData& y = b.as_list();
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (std::size_t i = 0; i < x.items.size(); ++i) {
        if (!equals_at(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const DictData& x = a.as_dict();
      const DictData& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* w = y.find(k);
        if (w == nullptr || !equals_at(v, *w, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kObject:
      return &a.as_object() == &b.as_object();
    case Value::Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

bool less_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  // UTF-8 byte order is code point order.
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals_at(x[i], y[i], depth + 1)) return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  throw InputError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                   b.type_name() + "'");
}

std::string key_at(const Value& k, int depth) {
  check_depth(depth);
  switch (k.kind()) {
    case Value::Kind::kString:
      return "s" + k.as_string();
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return "n" + std::to_string(k.as_int());
    case Value::Kind::kFloat: {
      const double d = k.as_double();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
        return "n" + std::to_string(static_cast<std::int64_t>(d));
      }
      return "f" + py_float_repr(d);
    }
    case Value::Kind::kNone:
      return "N";
    case Value::Kind::kUndefined:
      return "U";
    case Value::Kind::kList: {
      if (!k.as_list().tuple) throw InputError("unhashable type: 'list'");
      std::string out = "t";
      for (const Value& e : k.as_list().items) {
        const std::string part = key_at(e, depth + 1);
        out += std::to_string(part.size()) + ":" + part;
      }
      return out;
    }
    case Value::Kind::kDict:
      throw InputError("unhashable type: 'dict'");
    case Value::Kind::kObject: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "o%p", static_cast<const void*>(&k.as_object()));
      return buf;
    }
    case Value::Kind::kFunction: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "c%p", static_cast<const void*>(&k.as_function()));
      return buf;
    }
  }
  return "";
}

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  char buf[16];
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t start = i;
    const char32_t c = tok::utf8_next(s, i);
    switch (c) {
      case U'"':
        out += "\\\"";
        continue;
      case U'\\':
        out += "\\\\";
        continue;
      case U'\n':
        out += "\\n";
        continue;
      case U'\r':
        out += "\\r";
        continue;
      case U'\t':
        out += "\\t";
        continue;
      case U'\b':
        out += "\\b";
        continue;
      case U'\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c > 0xFFFF) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      out += s.substr(start, i - start);
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return k.as_string();
    case Value::Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::kInt:
      return std::to_string(k.as_int());
    case Value::Kind::kFloat:
      return json_float(k.as_double());
    case Value::Kind::kNone:
      return "null";
    default:
      throw InputError("keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

void json_at(const Value& v, const JsonStyle& st, int depth, std::string& out) {
  check_depth(depth);
  if (out.size() > st.max_bytes) {
    throw InputError("tojson result exceeds " + std::to_string(st.max_bytes) + " bytes");
  }
  // With an indent, each item starts on its own line at depth+1 and the closer at depth.
  auto newline = [&](int level) {
    if (!st.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *st.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += json_float(v.as_double());
      return;
    case Value::Kind::kString:
      json_string(v.as_string(), st.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += st.item_separator;
        newline(depth + 1);
        json_at(items[i], st, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, x] : v.as_dict().items()) items.emplace_back(json_key(k), &x);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += st.item_separator;
        newline(depth + 1);
        json_string(items[i].first, st.ensure_ascii, out);
        out += st.key_separator;
        json_at(*items[i].second, st, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      throw InputError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  check_depth(depth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      tok::utf8_require_valid(s, "chat template variable");
      return Value::string(s);
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      for (const auto& [k, e] : j.items()) {
        tok::utf8_require_valid(k, "chat template variable key");
        d.set(Value::string(k), from_json_at(e, depth + 1));
      }
      return Value::dict(std::move(d));
    }
    default:
      throw InputError("unsupported JSON value (binary) in a chat template variable");
  }
}

}  // namespace

const Value* DictData::find(const Value& key) const {
  const auto it = index_.find(dict_key(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void DictData::set(Value key, Value value) {
  std::string k = dict_key(key);
  const auto it = index_.find(k);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(std::move(k), items_.size());
  items_.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string hint) {
  Value v;
  v.v_ = Undefined{std::move(hint)};
  return v;
}
Value Value::none() {
  Value v;
  v.v_ = None{};
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.v_ = b;
  return v;
}
Value Value::integer(std::int64_t i) {
  Value v;
  v.v_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.v_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.v_ = std::move(s);
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.v_ = std::shared_ptr<const ListData>(new ListData{std::move(items), tuple});
  return v;
}
Value Value::dict(DictData d) {
  Value v;
  v.v_ = std::shared_ptr<const DictData>(std::make_shared<DictData>(std::move(d)));
  return v;
}
Value Value::object(std::shared_ptr<ObjectData> o) {
  Value v;
  v.v_ = std::move(o);
  return v;
}
Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.v_ = std::shared_ptr<const Function>(new Function{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_double() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().items.empty();
    case Kind::kDict:
      return as_dict().size() != 0;
    default:
      return true;
  }
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return as_list().tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return as_object().is_namespace ? "Namespace" : "LoopContext";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) return "";
  return repr_at(v, 0);
}

std::string to_repr(const Value& v) { return repr_at(v, 0); }
bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
bool less_than(const Value& a, const Value& b) { return less_at(a, b, 0); }
std::string dict_key(const Value& key) { return key_at(key, 0); }

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_at(v, style, 0, out);
  return out;
}

}  // namespace moebatch::jinja
