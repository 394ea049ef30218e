// jinja2's built-in tests (`x is defined`, `n is divisibleby 3`, ...), with the quirks of its
// Undefined: it is iterable, a sequence and callable.
#include <cmath>
#include <string>
#include <unordered_map>

#include "common/error.h"
#include "engine/tokenizer/jinja_builtins.h"
#include "engine/tokenizer/jinja_interp.h"
#include "engine/tokenizer/jinja_strings.h"

namespace moebatch::jinja {
namespace {

using Test = bool (*)(Interpreter&, const Value&, CallArgs&);

const Value& test_arg(const CallArgs& a, const char* name) {
  ArgReader r(name, a, {"other"});
  if (!r.get(0)) throw InputError(std::string("test '") + name + "' needs an argument");
  return *r.get(0);
}

/// Python's `a % b == 0` (ints or floats) for odd / even / divisibleby.
bool mod_is_zero(const Value& a, const Value& b, const char* name) {
  if (a.is_undefined()) fail_undefined(a);
  if (!a.is_number() || !b.is_number()) {
    throw InputError(std::string("test '") + name + "' needs numbers");
  }
  if (b.as_double() == 0) throw InputError("integer division or modulo by zero");
  if (a.is_integral() && b.is_integral()) return a.as_int() % b.as_int() == 0;
  return std::fmod(a.as_double(), b.as_double()) == 0;
}

bool no_args(const CallArgs& a, const char* name) {
  ArgReader(name, a, {});
  return true;
}

const std::unordered_map<std::string_view, Test>& tests() {
  static const std::unordered_map<std::string_view, Test> kTests = {
      {"defined", [](Interpreter&, const Value& v,
                     CallArgs& a) { return no_args(a, "defined") && !v.is_undefined(); }},
      {"undefined", [](Interpreter&, const Value& v,
                       CallArgs& a) { return no_args(a, "undefined") && v.is_undefined(); }},
      {"none",
       [](Interpreter&, const Value& v, CallArgs& a) { return no_args(a, "none") && v.is_none(); }},
      {"boolean", [](Interpreter&, const Value& v,
                     CallArgs& a) { return no_args(a, "boolean") && v.is_bool(); }},
      {"true", [](Interpreter&, const Value& v,
                  CallArgs& a) { return no_args(a, "true") && v.is_bool() && v.as_bool(); }},
      {"false", [](Interpreter&, const Value& v,
                   CallArgs& a) { return no_args(a, "false") && v.is_bool() && !v.as_bool(); }},
      {"integer", [](Interpreter&, const Value& v,
                     CallArgs& a) { return no_args(a, "integer") && v.is_int(); }},
      {"float", [](Interpreter&, const Value& v,
                   CallArgs& a) { return no_args(a, "float") && v.is_float(); }},
      {"number", [](Interpreter&, const Value& v,
                    CallArgs& a) { return no_args(a, "number") && v.is_number(); }},
      {"string", [](Interpreter&, const Value& v,
                    CallArgs& a) { return no_args(a, "string") && v.is_string(); }},
      {"mapping", [](Interpreter&, const Value& v,
                     CallArgs& a) { return no_args(a, "mapping") && v.is_dict(); }},
      // Undefined is iterable (empty) and a sequence (len 0) in jinja2, and callable (raising).
      {"iterable",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "iterable") &&
                (v.is_list() || v.is_dict() || v.is_string() || v.is_undefined());
       }},
      {"sequence",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "sequence") &&
                (v.is_list() || v.is_dict() || v.is_string() || v.is_undefined());
       }},
      {"callable",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "callable") && (v.is_function() || v.is_undefined());
       }},
      {"escaped", [](Interpreter&, const Value&, CallArgs& a) { return !no_args(a, "escaped"); }},
      {"lower", [](Interpreter&, const Value& v,
                   CallArgs& a) { return no_args(a, "lower") && py_is(to_str(v), "islower"); }},
      {"upper", [](Interpreter&, const Value& v,
                   CallArgs& a) { return no_args(a, "upper") && py_is(to_str(v), "isupper"); }},
      // odd is `value % 2 == 1`: true only for odd integers (and x.0 floats that are).
      {"odd",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "odd") && !mod_is_zero(v, Value::integer(2), "odd") &&
                mod_is_zero(v.is_float() ? Value::number(v.as_double() - 1)
                                         : Value::integer(v.as_int() - 1),
                            Value::integer(2), "odd");
       }},
      {"even",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "even") && mod_is_zero(v, Value::integer(2), "even");
       }},
      {"divisibleby",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return mod_is_zero(v, test_arg(a, "divisibleby"), "divisibleby");
       }},
      {"sameas",
       [](Interpreter&, const Value& v, CallArgs& a) {
         const Value& o = test_arg(a, "sameas");
         return v.kind() == o.kind() && equals(v, o);
       }},
      {"in",
       [](Interpreter&, const Value& v, CallArgs& a) {
         const Value& seq = test_arg(a, "in");
         if (seq.is_string())
           return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
         if (seq.is_dict()) return seq.as_dict().find(v) != nullptr;
         if (seq.is_list()) {
           for (const Value& x : seq.as_list().items) {
             if (equals(v, x)) return true;
           }
           return false;
         }
         if (seq.is_undefined()) return false;
         throw InputError("argument of type '" + seq.type_name() + "' is not iterable");
       }},
      {"filter",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "filter") && v.is_string() && has_filter(v.as_string());
       }},
      {"test",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return no_args(a, "test") && v.is_string() && has_test(v.as_string());
       }},
  };
  return kTests;
}

bool compare_test(std::string_view name, const Value& v, const CallArgs& a, bool& result) {
  const char* op = nullptr;
  if (name == "eq" || name == "equalto" || name == "==")
    op = "==";
  else if (name == "ne" || name == "!=")
    op = "!=";
  else if (name == "lt" || name == "lessthan" || name == "<")
    op = "<";
  else if (name == "le" || name == "<=")
    op = "<=";
  else if (name == "gt" || name == "greaterthan" || name == ">")
    op = ">";
  else if (name == "ge" || name == ">=")
    op = ">=";
  if (op == nullptr) return false;
  const Value& o = test_arg(a, std::string(name).c_str());
  const std::string_view s(op);
  if (s == "==")
    result = equals(v, o);
  else if (s == "!=")
    result = !equals(v, o);
  else {
    if (v.is_undefined()) fail_undefined(v);
    if (o.is_undefined()) fail_undefined(o);
    if (s == "<")
      result = less_than(v, o);
    else if (s == ">")
      result = less_than(o, v);
    else if (s == "<=")
      result = less_than(v, o) || equals(v, o);
    else
      result = less_than(o, v) || equals(v, o);
  }
  return true;
}

bool is_compare_test(std::string_view n) {
  return n == "eq" || n == "equalto" || n == "==" || n == "ne" || n == "!=" || n == "lt" ||
         n == "lessthan" || n == "<" || n == "le" || n == "<=" || n == "gt" || n == "greaterthan" ||
         n == ">" || n == "ge" || n == ">=";
}

}  // namespace

bool has_test(std::string_view name) { return tests().count(name) != 0 || is_compare_test(name); }

bool apply_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args) {
  bool result = false;
  if (compare_test(name, value, args, result)) return result;
  const auto it = tests().find(name);
  if (it == tests().end()) throw InputError("no test named '" + name + "'");
  return it->second(in, value, args);
}

}  // namespace moebatch::jinja
