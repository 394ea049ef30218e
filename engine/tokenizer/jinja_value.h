// The values a Jinja template computes with, modelled on the Python objects jinja2 sees when
// transformers renders a chat template: undefined, None, bool, int, float, str, list/tuple, dict
// (insertion-ordered), namespace/loop objects and callables. Lists and dicts are shared and
// never mutated after construction (transformers renders in jinja2's ImmutableSandboxedEnvironment,
// which forbids list.append and friends); namespaces are the one mutable object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace moebatch::jinja {

class Value;
class Interpreter;

/// Arguments of one call: positional, then keyword in call order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

/// A list or a tuple.
struct ListData {
  std::vector<Value> items;
  bool tuple = false;
};

/// A dict in insertion order; keys are hashed through dict_key().
class DictData {
 public:
  /// The value under `key`, or nullptr.
  const Value* find(const Value& key) const;
  /// Inserts or replaces (a replaced key keeps its position, as in Python).
  void set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  /// Number of entries. Defined below Value: clang instantiates the vector's size() here,
  /// which needs pair<Value, Value> complete.
  std::size_t size() const;

 private:
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, std::size_t> index_;  // dict_key -> position in items_
};

/// namespace() objects (attributes assignable with `{% set ns.x = ... %}`) and loop variables.
struct ObjectData {
  DictData attrs;  // string keys only
  bool is_namespace = false;
};

/// A callable: macro, global function or bound method.
struct Function {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

/// One Jinja value. Copies are cheap: strings are copied, containers are shared.
class Value {
 public:
  enum class Kind : std::uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kObject,
    kFunction,
  };

  Value() = default;  ///< undefined
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(std::int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(DictData d);
  static Value object(std::shared_ptr<ObjectData> o);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  /// JSON -> value (objects keep their key order). InputError for invalid UTF-8 in a string.
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_object() const { return kind() == Kind::kObject; }
  bool is_function() const { return kind() == Kind::kFunction; }
  /// int or bool (Python's bool is an int)
  bool is_integral() const { return is_int() || is_bool(); }
  /// int, bool or float
  bool is_number() const { return is_integral() || is_float(); }

  /// Why an undefined value is undefined ("'x' is undefined").
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  bool as_bool() const { return std::get<bool>(v_); }
  /// int or bool as an integer
  std::int64_t as_int() const { return is_bool() ? as_bool() : std::get<std::int64_t>(v_); }
  /// any number as a double
  double as_double() const { return is_float() ? std::get<double>(v_) : double(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const ListData& as_list() const { return *std::get<std::shared_ptr<const ListData>>(v_); }
  const DictData& as_dict() const { return *std::get<std::shared_ptr<const DictData>>(v_); }
  ObjectData& as_object() const { return *std::get<std::shared_ptr<ObjectData>>(v_); }
  /// The shared object itself (a namespace or loop object).
  const std::shared_ptr<ObjectData>& object_ptr() const {
    return std::get<std::shared_ptr<ObjectData>>(v_);
  }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(v_); }

  /// Python truthiness (undefined is false).
  bool truthy() const;
  /// Python type name, for error messages ("dict", "str", "NoneType", ...).
  std::string type_name() const;

 private:
  struct Undefined {
    std::string hint;
  };
  struct None {};
  std::variant<Undefined, None, bool, std::int64_t, double, std::string,
               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>,
               std::shared_ptr<ObjectData>, std::shared_ptr<const Function>>
      v_;
};

/// Python str(): what `{{ v }}` prints (undefined prints nothing; lists and dicts print their
/// Python repr).
std::string to_str(const Value& v);
/// Python repr().
std::string to_repr(const Value& v);
/// Python ==.
bool equals(const Value& a, const Value& b);
/// Python <, for numbers, strings and lists; error for other pairs.
bool less_than(const Value& a, const Value& b);
/// The identity of a dict key (1, 1.0 and True are one key, as in Python); error if unhashable.
std::string dict_key(const Value& key);

/// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...) as transformers'
/// tojson filter calls it. indent: none = one line; an int n = n spaces; a string = itself.
struct JsonStyle {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  std::size_t max_bytes = SIZE_MAX;  ///< InputError once the text passes this
};
std::string to_json(const Value& v, const JsonStyle& style);

inline std::size_t DictData::size() const { return items_.size(); }

}  // namespace moebatch::jinja
