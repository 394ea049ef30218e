// What a template can call by name: jinja2's built-in filters (jinja_filters.cpp) and tests
// (jinja_tests.cpp), Python's str/dict/list methods and the globals transformers provides
// (jinja_methods.cpp).
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/tokenizer/jinja_value.h"

namespace moebatch::jinja {

class Interpreter;

/// Whether a filter / test of that name exists (the parser rejects unknown ones).
bool has_filter(std::string_view name);
bool has_test(std::string_view name);

/// value | name(args).
Value apply_filter(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);
/// value is name(args).
bool apply_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);

/// obj.name as a bound method: nullopt when `name` is no method of obj's type; an undefined
/// value (that fails when called) for a method the immutable sandbox forbids (list.append,
/// dict.update, ...).
std::optional<Value> method(Interpreter& in, const Value& obj, const std::string& name);

/// range, dict, namespace, raise_exception, strftime_now.
void add_globals(std::unordered_map<std::string, Value>& vars);

/// Python's `fmt % args` for %s %r %d %i %f %% (args: one value or a tuple).
std::string percent_format(const std::string& fmt, const Value& args);

/// Binds call arguments to a signature, as Python does: positional first, then by keyword.
class ArgReader {
 public:
  /// InputError when there are more positional arguments than names, or an unknown keyword.
  ArgReader(const std::string& fn, const CallArgs& args,
            std::initializer_list<std::string_view> names);
  /// The argument in slot `i` (positional i or keyword names[i]), or nullptr.
  const Value* get(std::size_t i) const { return slots_[i]; }
  /// The argument in slot `i`, or `dflt`.
  Value get_or(std::size_t i, Value dflt) const { return slots_[i] ? *slots_[i] : std::move(dflt); }

 private:
  std::vector<const Value*> slots_;
};

}  // namespace moebatch::jinja
