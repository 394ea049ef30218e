// jinja2's built-in filters, with transformers' tojson in place of jinja2's (which
// HTML-escapes and sorts keys). Each follows the jinja2 3.1 source, including its handling of
// undefined values (most filters read undefined as "" or as an empty sequence).
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "common/error.h"
#include "engine/tokenizer/jinja_builtins.h"
#include "engine/tokenizer/jinja_interp.h"
#include "engine/tokenizer/jinja_strings.h"

namespace moebatch::jinja {
namespace {

using Filter = Value (*)(Interpreter&, const Value&, CallArgs&);

/// jinja2's make_attrgetter: "a.b.0" walks getitem part by part (digit parts index).
Value get_path(Interpreter& in, Value item, const Value& attribute) {
  if (attribute.is_integral()) return in.getitem(item, attribute);
  if (!attribute.is_string()) throw InputError("attribute must be a string or an integer");
  for (const std::string& part : py_split(attribute.as_string(), std::string("."), -1, false)) {
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    item = in.getitem(item, digits ? Value::integer(parse_digits(part, "attribute index out of range"))
                                   : Value::string(part));
  }
  return item;
}

/// Sort / unique / min / max key: the attribute (if any), lowercased unless case-sensitive.
Value sort_key(Interpreter& in, const Value& item, const Value* attribute, bool case_sensitive) {
  Value k = attribute ? get_path(in, item, *attribute) : item;
  if (!case_sensitive && k.is_string()) return Value::string(py_lower(k.as_string()));
  return k;
}

bool flag(const ArgReader& r, std::size_t i, bool dflt) {
  const Value* v = r.get(i);
  return v ? v->truthy() : dflt;
}

std::string soft_str(const Value& v) { return to_str(v); }

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader("abs", a, {});
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) throw InputError("integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  throw InputError("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("attr", a, {"name"});
  if (!r.get(0) || !r.get(0)->is_string()) throw InputError("attr() needs an attribute name");
  // Python getattr: a dict's keys are not attributes (only its methods are).
  if (v.is_dict()) {
    return method(in, v, r.get(0)->as_string()).value_or(Value::undefined("no attribute"));
  }
  return in.getattr(v, r.get(0)->as_string());
}

Value f_capitalize(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("capitalize", a, {});
  return in.make_string(py_capitalize(soft_str(v)));
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader("length", a, {});
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::integer(0);
    case Value::Kind::kString:
      return Value::integer(static_cast<std::int64_t>(py_len(v.as_string())));
    case Value::Kind::kList:
      return Value::integer(static_cast<std::int64_t>(v.as_list().items.size()));
    case Value::Kind::kDict:
      return Value::integer(static_cast<std::int64_t>(v.as_dict().size()));
    default:
      throw InputError("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader r("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (flag(r, 1, false) && !v.truthy())) {
    return r.get_or(0, Value::string(""));
  }
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw InputError("dictsort expects a mapping, got " + v.type_name());
  const bool cs = flag(r, 0, false);
  const Value by = r.get_or(1, Value::string("key"));
  if (!by.is_string() || (by.as_string() != "key" && by.as_string() != "value")) {
    throw InputError("You can only sort by either 'key' or 'value'");
  }
  const std::size_t pos = by.as_string() == "key" ? 0 : 1;
  std::vector<Value> items;
  for (const auto& [k, x] : v.as_dict().items()) items.push_back(Value::list({k, x}, true));
  const bool rev = flag(r, 2, false);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(in, x.as_list().items[pos], nullptr, cs);
    const Value ky = sort_key(in, y.as_list().items[pos], nullptr, cs);
    return rev ? less_than(ky, kx) : less_than(kx, ky);
  });
  return in.make_list(std::move(items));
}

Value f_escape(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("escape", a, {});
  std::string out;
  for (const char c : soft_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return in.make_string(std::move(out));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("first", a, {});
  const std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("last", a, {});
  const std::vector<Value> items = in.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

/// Python float(str): surrounding whitespace, underscores between digits, inf/nan.
std::optional<double> parse_float(const std::string& text) {
  std::string s = py_strip(text, std::nullopt, true, true);
  std::string clean;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    clean += s[i];
  }
  if (clean.empty() || clean.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader r("float", a, {"default"});
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    if (const auto d = parse_float(v.as_string())) return Value::number(*d);
  }
  return r.get_or(0, Value::number(0.0));
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader r("int", a, {"default", "base"});
  if (v.is_undefined()) fail_undefined(v);
  const Value dflt = r.get_or(0, Value::integer(0));
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (std::isnan(d)) return dflt;
    if (std::isinf(d) || std::fabs(d) >= 9.2e18)
      throw InputError("cannot convert float to integer");
    return Value::integer(static_cast<std::int64_t>(d));
  }
  if (!v.is_string()) return dflt;
  const Value base = r.get_or(1, Value::integer(10));
  std::string s = py_strip(v.as_string(), std::nullopt, true, true);
  std::string digits;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && s[i - 1] != '_' && s[i + 1] != '_') continue;
    digits += s[i];
  }
  if (!digits.empty() && base.is_integral() && base.as_int() >= 2 && base.as_int() <= 36) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(digits.c_str(), &end, static_cast<int>(base.as_int()));
    if (end == digits.c_str() + digits.size() && errno == 0 &&
        digits.find_first_of(" \t") == std::string::npos) {
      return Value::integer(x);
    }
  }
  if (const auto d = parse_float(v.as_string())) {
    if (std::isnan(*d)) return dflt;
    if (std::isinf(*d) || std::fabs(*d) >= 9.2e18)
      throw InputError("cannot convert float to integer");
    return Value::integer(static_cast<std::int64_t>(*d));
  }
  return dflt;
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.keyword.empty() && !a.positional.empty()) {
    throw InputError("can't handle positional and keyword arguments at the same time");
  }
  if (!a.keyword.empty()) throw InputError("format with keyword arguments is not supported");
  return in.make_string(percent_format(soft_str(v), Value::list(a.positional, true)));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("indent", a, {"width", "first", "blank"});
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) throw InputError("indent expects a string, got " + v.type_name());
  const Value width = r.get_or(0, Value::integer(4));
  if (width.is_integral() && width.as_int() > 1000) throw InputError("indent width over 1000");
  const std::string pad =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, width.as_int())), ' ');
  // jinja2 appends a newline before splitlines(), so a trailing newline yields no extra line.
  const std::vector<std::string> lines = py_splitlines(soft_str(v) + "\n");
  std::string out;
  if (flag(r, 2, false)) {
    for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + pad : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines.front();
    for (std::size_t i = 1; i < lines.size(); ++i) {
      out += "\n" + (lines[i].empty() ? "" : pad + lines[i]);
    }
  }
  if (flag(r, 1, false)) out = pad + out;
  return in.make_string(std::move(out));
}

Value f_items(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("items", a, {});
  if (v.is_undefined()) return in.make_list({});
  if (!v.is_dict()) throw InputError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.as_dict().items()) out.push_back(Value::list({k, x}, true));
  return in.make_list(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("join", a, {"d", "attribute"});
  const std::string sep = soft_str(r.get_or(0, Value::string("")));
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += soft_str(r.get(1) ? get_path(in, item, *r.get(1)) : item);
    if (out.size() > in.limits().max_output_bytes)
      throw InputError("join result exceeds the output limit");
  }
  return in.make_string(std::move(out));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("list", a, {});
  return in.make_list(in.iterate(v));
}

Value f_lower(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("lower", a, {});
  return in.make_string(py_lower(soft_str(v)));
}

Value f_upper(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("upper", a, {});
  return in.make_string(py_upper(soft_str(v)));
}

/// map and select* iterate only a truthy value (jinja2's `if seq:`): 0, false, none give [].
std::vector<Value> iterate_if_truthy(Interpreter& in, const Value& v) {
  return v.truthy() ? in.iterate(v) : std::vector<Value>{};
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const std::vector<Value> items = iterate_if_truthy(in, v);
  if (a.positional.empty()) {
    ArgReader r("map", a, {"attribute", "default"});
    if (!r.get(0)) throw InputError("map() needs a filter name or attribute=");
    for (const Value& item : items) {
      Value x = get_path(in, item, *r.get(0));
      out.push_back(x.is_undefined() && r.get(1) ? *r.get(1) : std::move(x));
    }
    return in.make_list(std::move(out));
  }
  if (!a.positional[0].is_string()) throw InputError("map() filter name must be a string");
  const std::string name = a.positional[0].as_string();
  if (!has_filter(name)) throw InputError("no filter named '" + name + "'");
  for (const Value& item : items) {
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    out.push_back(apply_filter(in, name, item, rest));
  }
  return in.make_list(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  ArgReader r(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool cs = flag(r, 0, false);
  std::size_t best = 0;
  Value best_key = sort_key(in, items[0], r.get(1), cs);
  for (std::size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(in, items[i], r.get(1), cs);
    if (want_max ? less_than(best_key, k) : less_than(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

/// select / reject / selectattr / rejectattr.
Value select_items(Interpreter& in, const Value& v, CallArgs& a, bool keep, bool by_attr) {
  if (!a.keyword.empty()) throw InputError("select filters take no keyword arguments");
  std::size_t at = 0;
  const Value* attr = nullptr;
  if (by_attr) {
    if (a.positional.empty()) throw InputError("Missing parameter for attribute name");
    attr = &a.positional[at++];
  }
  std::string test;
  if (at < a.positional.size()) {
    if (!a.positional[at].is_string()) throw InputError("test name must be a string");
    test = a.positional[at++].as_string();
    if (!has_test(test)) throw InputError("no test named '" + test + "'");
  }
  std::vector<Value> out;
  for (const Value& item : iterate_if_truthy(in, v)) {
    const Value x = attr ? get_path(in, item, *attr) : item;
    bool ok = false;
    if (test.empty()) {
      ok = x.truthy();
    } else {
      CallArgs targs;
      targs.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(at),
                              a.positional.end());
      ok = apply_test(in, test, x, targs);
    }
    if (ok == keep) out.push_back(item);
  }
  return in.make_list(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, true, false);
}
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, false, false);
}
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, true, true);
}
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, false, true);
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("replace", a, {"old", "new", "count"});
  if (!r.get(0) || !r.get(1)) throw InputError("replace() needs old and new");
  const Value count = r.get_or(2, Value::none());
  if (!count.is_none() && !count.is_integral())
    throw InputError("replace() count must be an integer");
  return in.make_string(py_replace(soft_str(v), soft_str(*r.get(0)), soft_str(*r.get(1)),
                                   count.is_none() ? -1 : count.as_int(),
                                   in.limits().max_output_bytes));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return in.make_string(utf8_encode(u));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return in.make_list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader r("round", a, {"precision", "method"});
  const Value precision = r.get_or(0, Value::integer(0));
  const Value how = r.get_or(1, Value::string("common"));
  if (!precision.is_integral()) throw InputError("round() precision must be an integer");
  if (!how.is_string() ||
      (how.as_string() != "common" && how.as_string() != "ceil" && how.as_string() != "floor")) {
    throw InputError("method must be common, ceil or floor");
  }
  if (!v.is_number())
    throw InputError("type " + v.type_name() + " doesn't define __round__ method");
  const std::int64_t p = precision.as_int();
  if (how.as_string() == "common") {
    if (v.is_integral()) {
      // round(int, n) stays an int; a negative n rounds to tens, hundreds, ... (ties to even).
      if (p >= 0) return Value::integer(v.as_int());
      if (p < -18) return Value::integer(0);
      std::int64_t m = 1;
      for (std::int64_t i = 0; i < -p; ++i) m *= 10;
      const std::int64_t x = v.as_int();
      std::int64_t q = x / m, r = x % m;
      if (r < 0) {
        r += m;
        --q;
      }
      if (2 * r > m || (2 * r == m && q % 2 != 0)) ++q;
      return Value::integer(q * m);
    }
    const double d = v.as_double();
    if (!std::isfinite(d)) return Value::number(d);
    if (p <= 0) {
      const double scale = std::pow(10.0, static_cast<double>(-p));
      return Value::number(std::nearbyint(d / scale) * scale);  // ties to even, as Python
    }
    // Python rounds the exact binary value, as printf does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<std::int64_t>(p, 300)), d);
    return Value::number(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(p));
  const double x = v.as_double() * scale;
  return Value::number((how.as_string() == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("safe", a, {});
  return v.is_string() ? v : in.make_string(soft_str(v));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("sort", a, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = in.iterate(v);
  const bool rev = flag(r, 0, false);
  const bool cs = flag(r, 1, false);
  // attribute may list several, comma separated: compare by each in turn.
  std::vector<Value> attrs;
  if (r.get(2) && r.get(2)->is_string()) {
    for (const std::string& part : py_split(r.get(2)->as_string(), std::string(","), -1, false)) {
      attrs.push_back(Value::string(py_strip(part, std::nullopt, true, true)));
    }
  } else if (r.get(2)) {
    attrs.push_back(*r.get(2));
  }
  auto key = [&](const Value& x) {
    if (attrs.empty()) return sort_key(in, x, nullptr, cs);
    std::vector<Value> parts;
    for (const Value& at : attrs) parts.push_back(sort_key(in, x, &at, cs));
    return Value::list(std::move(parts), true);
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& x : items) keyed.emplace_back(key(x), std::move(x));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, x] : keyed) out.push_back(std::move(x));
  return in.make_list(std::move(out));
}

Value f_string(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("string", a, {});
  return v.is_string() ? v : in.make_string(soft_str(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("sum", a, {"attribute", "start"});
  Value total = r.get_or(1, Value::integer(0));
  for (const Value& item : in.iterate(v)) {
    const Value x = r.get(0) ? get_path(in, item, *r.get(0)) : item;
    if (!total.is_number() || !x.is_number()) {
      throw InputError("unsupported operand type(s) for +: '" + total.type_name() + "' and '" +
                       x.type_name() + "'");
    }
    if (total.is_integral() && x.is_integral()) {
      std::int64_t s = 0;
      if (__builtin_add_overflow(total.as_int(), x.as_int(), &s))
        throw InputError("integer overflow");
      total = Value::integer(s);
    } else {
      total = Value::number(total.as_double() + x.as_double());
    }
  }
  return total;
}

Value f_title(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader("title", a, {});
  // jinja2 splits at runs of [-\s({[<] and upper-cases each piece's first character.
  const std::u32string u = utf8_decode(soft_str(v));
  auto is_sep = [](char32_t c) {
    return py_isspace(c) || c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<';
  };
  std::u32string out;
  for (std::size_t i = 0; i < u.size();) {
    const bool sep = is_sep(u[i]);
    std::size_t j = i;
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    out += utf8_decode(py_upper(utf8_encode(std::u32string(1, u[i]))));
    out += utf8_decode(py_lower(utf8_encode(std::u32string_view(u).substr(i + 1, j - i - 1))));
    i = j;
  }
  return in.make_string(utf8_encode(out));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  st.ensure_ascii = flag(r, 0, false);
  if (const Value* ind = r.get(1); ind && !ind->is_none()) {
    if (ind->is_string()) {
      st.indent = ind->as_string();
    } else if (ind->is_integral()) {
      if (ind->as_int() > 1000) throw InputError("tojson indent over 1000");
      st.indent =
          std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, ind->as_int())), ' ');
    } else {
      throw InputError("tojson indent must be an int or a str");
    }
    st.item_separator = ",";
  }
  if (const Value* sep = r.get(2); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->as_list().items.size() != 2 ||
        !sep->as_list().items[0].is_string() || !sep->as_list().items[1].is_string()) {
      throw InputError("tojson separators must be a pair of strings");
    }
    st.item_separator = sep->as_list().items[0].as_string();
    st.key_separator = sep->as_list().items[1].as_string();
  }
  st.sort_keys = flag(r, 3, false);
  st.max_bytes = in.limits().max_output_bytes;
  return in.make_string(to_json(v, st));
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("trim", a, {"chars"});
  std::optional<std::string> chars;
  if (r.get(0) && !r.get(0)->is_none()) chars = soft_str(*r.get(0));
  return in.make_string(py_strip(soft_str(v), chars, true, true));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  ArgReader r("unique", a, {"case_sensitive", "attribute"});
  const bool cs = flag(r, 0, false);
  std::vector<Value> out;
  DictData seen;
  for (const Value& item : in.iterate(v)) {
    const Value k = sort_key(in, item, r.get(1), cs);
    if (seen.find(k) != nullptr) continue;
    seen.set(k, Value::none());
    out.push_back(item);
  }
  return in.make_list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  ArgReader("wordcount", a, {});
  std::int64_t n = 0;
  bool in_word = false;
  for (const char32_t c : utf8_decode(soft_str(v))) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    const bool word = c == U'_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                      (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) ||
                      (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME);
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::integer(n);
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> kFilters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"capitalize", f_capitalize},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return kFilters;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) != 0; }

Value apply_filter(Interpreter& in, const std::string& name, const Value& value, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw InputError("no filter named '" + name + "'");
  return it->second(in, value, args);
}

}  // namespace moebatch::jinja
