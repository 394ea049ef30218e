// Python methods templates call on strings, dicts and lists, and the template globals.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "common/error.h"
#include "engine/tokenizer/jinja_builtins.h"
#include "engine/tokenizer/jinja_interp.h"
#include "engine/tokenizer/jinja_strings.h"

namespace moebatch::jinja {
namespace {

std::optional<std::string> opt_str(const Value* v, const char* what) {
  if (v == nullptr || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw InputError(std::string(what) + " must be str or None");
  return v->as_string();
}

std::optional<std::int64_t> opt_int(const Value* v) {
  if (v == nullptr || v->is_none()) return std::nullopt;
  if (!v->is_integral()) throw InputError("slice indices must be integers or None");
  return v->as_int();
}

const std::string& str_arg(const Value* v, const char* fn) {
  if (v == nullptr) throw InputError(std::string(fn) + "() missing a required argument");
  if (!v->is_string()) {
    throw InputError(std::string(fn) + "() argument must be str, not " + v->type_name());
  }
  return v->as_string();
}

Value str_list(Interpreter& in, const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const std::string& p : parts) items.push_back(Value::string(p));
  return in.make_list(std::move(items));
}

/// startswith / endswith with a str or a tuple of str, and optional start/end.
Value affix_test(const Value& self, const CallArgs& a, bool prefix) {
  const char* fn = prefix ? "startswith" : "endswith";
  ArgReader r(fn, a, {"prefix", "start", "end"});
  const Value* arg = r.get(0);
  if (arg == nullptr) throw InputError(std::string(fn) + "() takes at least 1 argument");
  std::vector<std::string> options;
  if (arg->is_list() && arg->as_list().tuple) {
    for (const Value& v : arg->as_list().items) options.push_back(str_arg(&v, fn));
  } else {
    options.push_back(str_arg(arg, fn));
  }
  // Narrow to [start:end] in code points, as Python does.
  std::string s = self.as_string();
  if (r.get(1) || r.get(2)) {
    const std::u32string u = utf8_decode(s);
    std::u32string w;
    for (const std::size_t i :
         py_slice_indices(u.size(), opt_int(r.get(1)), opt_int(r.get(2)), std::nullopt)) {
      w += u[i];
    }
    s = utf8_encode(w);
  }
  for (const std::string& o : options) {
    if (o.size() <= s.size() && (prefix ? s.compare(0, o.size(), o) == 0
                                        : s.compare(s.size() - o.size(), o.size(), o) == 0)) {
      return Value::boolean(true);
    }
  }
  return Value::boolean(false);
}

/// str.format with {}, {0}, {name}, {{ and }} (conversions !s !r; no format specs).
std::string str_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  std::size_t auto_index = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        throw InputError("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const std::size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw InputError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conv = 's';
    if (const auto bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) throw InputError("unsupported format conversion");
      conv = field[bang + 1];
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos || field.find('.') != std::string::npos ||
        field.find('[') != std::string::npos) {
      throw InputError("format specs and field attributes are not supported in str.format");
    }
    const Value* v = nullptr;
    if (field.empty() || (field.find_first_not_of("0123456789") == std::string::npos)) {
      const std::size_t idx = field.empty() ? auto_index++
                                             : static_cast<std::size_t>(parse_digits(field, "Replacement index out of range"));
      if (idx >= a.positional.size()) throw InputError("Replacement index out of range");
      v = &a.positional[idx];
    } else {
      for (const auto& [k, x] : a.keyword) {
        if (k == field) v = &x;
      }
      if (v == nullptr) throw InputError("KeyError: '" + field + "'");
    }
    out += conv == 'r' ? to_repr(*v) : to_str(*v);
  }
  return out;
}

Value str_method(Interpreter& in, const std::string& name, const Value& self, const CallArgs& a) {
  const std::string& s = self.as_string();
  if (name == "startswith" || name == "endswith") return affix_test(self, a, name == "startswith");
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ArgReader r(name, a, {"chars"});
    return in.make_string(
        py_strip(s, opt_str(r.get(0), "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    ArgReader r(name, a, {"sep", "maxsplit"});
    const Value maxsplit = r.get_or(1, Value::integer(-1));
    if (!maxsplit.is_integral()) throw InputError("maxsplit must be an integer");
    return str_list(in, py_split(s, opt_str(r.get(0), "sep"), maxsplit.as_int(), name == "rsplit"));
  }
  if (name == "splitlines") return str_list(in, py_splitlines(s));
  if (name == "replace") {
    ArgReader r(name, a, {"old", "new", "count"});
    const Value count = r.get_or(2, Value::integer(-1));
    if (!count.is_integral()) throw InputError("replace() count must be an integer");
    return in.make_string(py_replace(s, str_arg(r.get(0), "replace"), str_arg(r.get(1), "replace"),
                                     count.as_int(), in.limits().max_output_bytes));
  }
  if (name == "upper") return in.make_string(py_upper(s));
  if (name == "lower" || name == "casefold") return in.make_string(py_lower(s));
  if (name == "title") return in.make_string(py_title(s));
  if (name == "capitalize") return in.make_string(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    ArgReader r(name, a, {"sub", "start", "end"});
    const std::int64_t p = py_find(s, str_arg(r.get(0), name.c_str()), opt_int(r.get(1)),
                                   opt_int(r.get(2)), name[0] == 'r');
    if (p < 0 && (name == "index" || name == "rindex")) throw InputError("substring not found");
    return Value::integer(p);
  }
  if (name == "count") {
    ArgReader r(name, a, {"sub"});
    return Value::integer(py_count(s, str_arg(r.get(0), "count")));
  }
  if (name == "join") {
    ArgReader r(name, a, {"iterable"});
    if (r.get(0) == nullptr) throw InputError("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : in.iterate(*r.get(0))) {
      if (!first) out += s;
      first = false;
      out += str_arg(&v, "join");
    }
    return in.make_string(std::move(out));
  }
  if (name == "format") return in.make_string(str_format(s, a));
  if (name == "removeprefix" || name == "removesuffix") {
    ArgReader r(name, a, {"affix"});
    const std::string& x = str_arg(r.get(0), name.c_str());
    const bool pre = name == "removeprefix";
    if (x.size() <= s.size() &&
        (pre ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)) {
      return in.make_string(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    }
    return self;
  }
  ArgReader r(name, a, {});
  return Value::boolean(py_is(s, name));  // isalpha, isdigit, ...
}

bool is_str_method(const std::string& n) {
  static const char* const kNames[] = {
      "startswith", "endswith",   "strip",   "lstrip",       "rstrip",      "split",
      "rsplit",     "splitlines", "replace", "upper",        "lower",       "casefold",
      "title",      "capitalize", "find",    "rfind",        "index",       "rindex",
      "count",      "join",       "format",  "isalpha",      "isdigit",     "isalnum",
      "islower",    "isupper",    "isspace", "removeprefix", "removesuffix"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

Value dict_method(Interpreter& in, const std::string& name, const Value& self, const CallArgs& a) {
  const DictData& d = self.as_dict();
  if (name == "get") {
    ArgReader r(name, a, {"key", "default"});
    if (r.get(0) == nullptr) throw InputError("get() takes at least 1 argument");
    const Value* v = d.find(*r.get(0));
    return v ? *v : r.get_or(1, Value::none());
  }
  ArgReader r(name, a, {});
  if (name == "copy") return self;
  std::vector<Value> out;
  out.reserve(d.size());
  for (const auto& [k, v] : d.items()) {
    if (name == "items")
      out.push_back(Value::list({k, v}, true));
    else
      out.push_back(name == "keys" ? k : v);
  }
  return in.make_list(std::move(out));
}

Value list_method(Interpreter&, const std::string& name, const Value& self, const CallArgs& a) {
  ArgReader r(name, a, {"value"});
  if (r.get(0) == nullptr) throw InputError(name + "() takes exactly one argument");
  const auto& items = self.as_list().items;
  std::int64_t n = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!equals(items[i], *r.get(0))) continue;
    if (name == "index") return Value::integer(static_cast<std::int64_t>(i));
    ++n;
  }
  if (name == "index") throw InputError(to_repr(*r.get(0)) + " is not in list");
  return Value::integer(n);
}

Value bind(const Value& self, std::string name,
           Value (*fn)(Interpreter&, const std::string&, const Value&, const CallArgs&)) {
  return Value::function(
      name, [self, name, fn](Interpreter& in, CallArgs& args) { return fn(in, name, self, args); });
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() +
                          "' object is unsafe");
}

std::string strftime_utc(std::chrono::system_clock::time_point now, const std::string& fmt) {
  if (fmt.empty()) return "";
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::string buf(fmt.size() * 8 + 64, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
    buf.resize(buf.size() * 4);
  }
  return "";
}

}  // namespace

ArgReader::ArgReader(const std::string& fn, const CallArgs& args,
                     std::initializer_list<std::string_view> names)
    : slots_(names.size(), nullptr) {
  if (args.positional.size() > names.size()) {
    throw InputError(fn + "() takes at most " + std::to_string(names.size()) + " arguments (" +
                     std::to_string(args.positional.size()) + " given)");
  }
  for (std::size_t i = 0; i < args.positional.size(); ++i) slots_[i] = &args.positional[i];
  for (const auto& [k, v] : args.keyword) {
    std::size_t i = 0;
    for (const std::string_view n : names) {
      if (n == k) break;
      ++i;
    }
    if (i == names.size())
      throw InputError(fn + "() got an unexpected keyword argument '" + k + "'");
    if (slots_[i] != nullptr)
      throw InputError(fn + "() got multiple values for argument '" + k + "'");
    slots_[i] = &v;
  }
}

std::optional<Value> method(Interpreter&, const Value& obj, const std::string& name) {
  if (obj.is_string() && is_str_method(name)) return bind(obj, name, str_method);
  if (obj.is_dict()) {
    if (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy") {
      return bind(obj, name, dict_method);
    }
    if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
        name == "clear") {
      return unsafe(obj, name);
    }
  }
  if (obj.is_list()) {
    if (name == "index" || name == "count") return bind(obj, name, list_method);
    if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
        name == "remove" || name == "reverse" || name == "sort" || name == "clear") {
      return unsafe(obj, name);
    }
  }
  return std::nullopt;
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> items;
  if (args.is_list() && args.as_list().tuple) {
    items = args.as_list().items;
  } else {
    items.push_back(args);
  }
  std::string out;
  std::size_t next = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    // %[flags][width][.precision]type, the numeric ones formatted by printf as Python does.
    std::size_t j = i + 1;
    while (j < fmt.size() && std::string_view("-+ 0#").find(fmt[j]) != std::string_view::npos) ++j;
    while (j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j]))) ++j;
    if (j < fmt.size() && fmt[j] == '.') {
      ++j;
      while (j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j]))) ++j;
    }
    if (j >= fmt.size()) throw InputError("incomplete format");
    const char type = fmt[j];
    const std::string spec = fmt.substr(i, j - i);  // without the type
    i = j;
    for (std::size_t k = 1, n = 0; k <= spec.size(); ++k) {
      // Widths and precisions stay small: the buffer below is fixed and output is bounded.
      if (k < spec.size() && std::isdigit(static_cast<unsigned char>(spec[k]))) {
        n = n * 10 + static_cast<std::size_t>(spec[k] - '0');
        if (n > 400) throw InputError("format width or precision over 400");
      } else {
        n = 0;
      }
    }
    if (type == '%') {
      out += '%';
      continue;
    }
    if (next >= items.size()) throw InputError("not enough arguments for format string");
    const Value& v = items[next++];
    char buf[512];
    if (type == 's' || type == 'r') {
      const std::string text = type == 's' ? to_str(v) : to_repr(v);
      if (spec == "%") {
        out += text;
      } else {
        // Width and precision count code points, not bytes.
        std::u32string u = utf8_decode(text);
        const std::size_t dot = spec.find('.');
        if (dot != std::string::npos) u = u.substr(0, std::stoul("0" + spec.substr(dot + 1)));
        const std::string digits =
            spec.substr(1, dot == std::string::npos ? std::string::npos : dot - 1);
        const std::size_t wpos = digits.find_first_of("123456789");
        const std::size_t width = wpos == std::string::npos ? 0 : std::stoul(digits.substr(wpos));
        const std::string pad(width > u.size() ? width - u.size() : 0, ' ');
        const bool left = digits.find('-') != std::string::npos;
        out += left ? utf8_encode(u) + pad : pad + utf8_encode(u);
      }
    } else if (std::string_view("diouxXeEfFgG").find(type) != std::string_view::npos) {
      if (!v.is_number()) {
        throw InputError(std::string("%") + type + " format: a real number is required, not " +
                         v.type_name());
      }
      const bool integral = std::string_view("diouxX").find(type) != std::string_view::npos;
      if (integral) {
        const long long n = v.is_float() ? static_cast<long long>(v.as_double()) : v.as_int();
        const char t = (type == 'i' || type == 'u') ? 'd' : type;
        std::snprintf(buf, sizeof buf, (spec + "ll" + t).c_str(), n);
      } else {
        std::snprintf(buf, sizeof buf, (spec + type).c_str(), v.as_double());
      }
      out += buf;
    } else {
      throw InputError(std::string("unsupported format character '") + type + "'");
    }
  }
  if (next < items.size()) throw InputError("not all arguments converted during string formatting");
  return out;
}

void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["range"] = Value::function("range", [](Interpreter& in, CallArgs& a) {
    ArgReader r("range", a, {"a", "b", "step"});
    std::int64_t start = 0, stop = 0, step = 1;
    for (int i = 0; i < 3; ++i) {
      if (r.get(i) && !r.get(i)->is_integral()) {
        throw InputError("'" + r.get(i)->type_name() +
                         "' object cannot be interpreted as an integer");
      }
    }
    if (r.get(0) == nullptr) throw InputError("range expected at least 1 argument, got 0");
    if (r.get(1) == nullptr) {
      stop = r.get(0)->as_int();
    } else {
      start = r.get(0)->as_int();
      stop = r.get(1)->as_int();
      if (r.get(2)) step = r.get(2)->as_int();
    }
    if (step == 0) throw InputError("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<std::int64_t>(out.size()) >= in.limits().max_range) {
        throw InputError("range too big, maximum size for range is " +
                         std::to_string(in.limits().max_range));
      }
      out.push_back(Value::integer(i));
    }
    return in.make_list(std::move(out));
  });
  vars["dict"] = Value::function("dict", [](Interpreter&, CallArgs& a) {
    DictData d;
    if (a.positional.size() > 1) throw InputError("dict expected at most 1 argument");
    if (!a.positional.empty()) {
      if (!a.positional[0].is_dict()) throw InputError("dict() argument must be a mapping");
      for (const auto& [k, v] : a.positional[0].as_dict().items()) d.set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
    return Value::dict(std::move(d));
  });
  vars["namespace"] = Value::function("namespace", [](Interpreter&, CallArgs& a) {
    auto ns = std::make_shared<ObjectData>();
    ns->is_namespace = true;
    if (a.positional.size() > 1) throw InputError("namespace expected at most 1 argument");
    if (!a.positional.empty()) {
      if (!a.positional[0].is_dict()) throw InputError("namespace() argument must be a mapping");
      for (const auto& [k, v] : a.positional[0].as_dict().items()) ns->attrs.set(k, v);
    }
    for (const auto& [k, v] : a.keyword) ns->attrs.set(Value::string(k), v);
    return Value::object(std::move(ns));
  });
  vars["raise_exception"] =
      Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
        ArgReader r("raise_exception", a, {"message"});
        throw RaisedError(r.get(0) ? to_str(*r.get(0)) : "");
      });
  vars["strftime_now"] = Value::function("strftime_now", [](Interpreter& in, CallArgs& a) {
    ArgReader r("strftime_now", a, {"format"});
    return in.make_string(strftime_utc(in.now(), str_arg(r.get(0), "strftime_now")));
  });
}

}  // namespace moebatch::jinja
