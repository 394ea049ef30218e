#include "engine/tokenizer/jinja_interp.h"

#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "common/error.h"
#include "engine/tokenizer/jinja_builtins.h"
#include "engine/tokenizer/jinja_strings.h"

namespace moebatch::jinja {
namespace {

/// An error already prefixed with the line:column of the innermost node that failed.
class LocatedError : public InputError {
 public:
  using InputError::InputError;
};

template <typename F>
auto located(int line, int col, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const LocatedError&) {
    throw;
  } catch (const RaisedError&) {
    throw;
  } catch (const InputError& e) {
    throw LocatedError("line " + std::to_string(line) + ":" + std::to_string(col) + ": " +
                       e.what());
  }
}

/// a op b on int64, or an error where Python would have grown a big int.
template <typename F>
std::int64_t checked(F op, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (op(a, b, &r)) throw InputError("integer overflow");
  return r;
}
bool add_ovf(std::int64_t a, std::int64_t b, std::int64_t* r) {
  return __builtin_add_overflow(a, b, r);
}
bool sub_ovf(std::int64_t a, std::int64_t b, std::int64_t* r) {
  return __builtin_sub_overflow(a, b, r);
}
bool mul_ovf(std::int64_t a, std::int64_t b, std::int64_t* r) {
  return __builtin_mul_overflow(a, b, r);
}

/// Python's floor division and modulo on ints.
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  if (a == INT64_MIN && b == -1) throw InputError("integer overflow");
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
std::int64_t floor_mod(std::int64_t a, std::int64_t b) {
  if (b == -1) return 0;
  std::int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  throw InputError("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                   b.type_name() + "'");
}

}  // namespace

void fail_undefined(const Value& v) {
  throw InputError(v.undefined_hint().empty() ? "undefined value" : v.undefined_hint());
}

// --- rendering ------------------------------------------------------------------------------

std::string Interpreter::run(const Body& body,
                             const std::vector<std::pair<std::string, Value>>& vars) {
  auto globals = std::make_shared<Scope>();
  add_globals(globals->vars);
  auto top = std::make_shared<Scope>();
  top->parent = globals;
  for (const auto& [k, v] : vars) top->vars[k] = v;
  std::string out;
  out_ = &out;
  struct CycleBreaker {
    Interpreter& in;
    ~CycleBreaker() { in.break_cycles(); }
  } breaker{*this};
  exec(body, top);
  return out;
}

void Interpreter::break_cycles() {
  std::unordered_set<const Scope*> seen;
  for (const ScopePtr& closure : closure_scopes_) {
    for (Scope* s = closure.get(); s != nullptr && seen.insert(s).second; s = s->parent.get()) {
      s->vars.clear();
    }
  }
  for (const auto& ns : namespaces_) ns->attrs = DictData();
  closure_scopes_.clear();
  namespaces_.clear();
}

void Interpreter::emit(std::string_view s) {
  if (out_->size() + s.size() > limits_.max_output_bytes) {
    throw InputError("output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  }
  charge(s.size());
  out_->append(s);
}

void Interpreter::charge(std::size_t bytes) {
  total_bytes_ += bytes;
  if (total_bytes_ > limits_.max_total_bytes) {
    throw InputError("template built more than " + std::to_string(limits_.max_total_bytes) +
                     " bytes of strings and lists");
  }
}

Value Interpreter::make_string(std::string s) {
  if (s.size() > limits_.max_output_bytes) {
    throw InputError("string of " + std::to_string(s.size()) + " bytes exceeds the limit of " +
                     std::to_string(limits_.max_output_bytes));
  }
  charge(s.size());
  return Value::string(std::move(s));
}

Value Interpreter::make_list(std::vector<Value> items, bool tuple) {
  charge(items.size() * sizeof(Value));
  return Value::list(std::move(items), tuple);
}

std::string Interpreter::capture(const Body& body, const ScopePtr& scope) {
  auto inner = std::make_shared<Scope>();
  inner->parent = scope;
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec(body, inner);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope) {
  for (const StmtPtr& s : body) {
    const Flow f = exec_stmt(*s, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::DepthGuard::DepthGuard(Interpreter& in) : in_(in) {
  // Nested blocks, expressions and macro calls multiply: bound their product, which is what
  // the C++ stack pays for.
  if (++in_.eval_depth_ > in_.limits_.max_eval_depth) {
    --in_.eval_depth_;
    throw InputError("evaluation nested more than " + std::to_string(in_.limits_.max_eval_depth) +
                     " levels deep");
  }
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope) {
  const DepthGuard guard(*this);
  return located(s.line, s.col, [&]() -> Flow {
    switch (s.kind) {
      case Stmt::Kind::kText:
        emit(s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        const Value v = eval(*s.expr, scope);
        emit(v.is_string() ? v.as_string() : to_str(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (!cond || eval(*cond, scope).truthy()) return exec(body, scope);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        assign(s, eval(*s.expr, scope), *scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetAttr: {
        const Value target = eval(*s.expr, scope);
        if (!target.is_object() || !target.as_object().is_namespace) {
          throw InputError("cannot assign attribute on non-namespace object");
        }
        Value v = eval(*s.value, scope);
        if (!v.is_undefined() && !v.is_none() && !v.is_number() && !v.is_string()) {
          // A value that may lead back here: remembered so run() can break the cycle.
          charge(sizeof(std::shared_ptr<ObjectData>));
          namespaces_.push_back(target.object_ptr());
        }
        target.as_object().attrs.set(Value::string(s.name), std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        Value v = make_string(capture(s.body, scope));
        if (s.cond) v = apply_filter_chain(*s.cond, std::move(v), scope);
        scope->vars[s.name] = std::move(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->vars[s.name] = define_macro(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call = *s.expr;
        const Value callee = eval(*call.args[0], scope);
        CallArgs args;
        eval_args(call, 1, scope, args);
        args.keyword.emplace_back("caller", define_macro(s, scope));
        emit(to_str(this->call(callee, args)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        const Value v = apply_filter_chain(*s.expr, make_string(capture(s.body, scope)), scope);
        emit(to_str(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kScope: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (std::size_t i = 0; i < s.names.size(); ++i) {
          inner->vars[s.names[i]] = eval(*s.defaults[i], scope);
        }
        return exec(s.body, inner);
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  });
}

void Interpreter::assign(const Stmt& s, const Value& v, Scope& scope) {
  if (!s.unpack) {
    scope.vars[s.names.front()] = v;
    return;
  }
  const std::vector<Value> parts = iterate(v);
  if (parts.size() != s.names.size()) {
    throw InputError("cannot unpack " + std::to_string(parts.size()) + " values into " +
                     std::to_string(s.names.size()) + " names");
  }
  for (std::size_t i = 0; i < parts.size(); ++i) scope.vars[s.names[i]] = parts[i];
}

void Interpreter::exec_for(const Stmt& s, const ScopePtr& scope) {
  std::vector<Value> items = iterate(eval(*s.expr, scope));
  auto bind = [&](const Value& item) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    assign(s, item, *inner);
    return inner;
  };
  if (s.cond) {
    // `for x in xs if cond`: filtered before the loop, so loop.length counts what remains.
    std::vector<Value> kept;
    for (Value& item : items) {
      if (eval(*s.cond, bind(item)).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    exec(s.else_body, inner);
    return;
  }
  // One loop object for the whole loop, updated per iteration (as jinja2's LoopContext).
  const auto n = static_cast<std::int64_t>(items.size());
  auto loop = std::make_shared<ObjectData>();
  auto index = std::make_shared<std::int64_t>(0);
  DictData& a = loop->attrs;
  a.set(Value::string("length"), Value::integer(n));
  a.set(Value::string("depth"), Value::integer(1));
  a.set(Value::string("depth0"), Value::integer(0));
  a.set(Value::string("cycle"), Value::function("cycle", [index](Interpreter&, CallArgs& args) {
          if (args.positional.empty()) throw InputError("no items for cycling given");
          return args.positional[static_cast<std::size_t>(*index) % args.positional.size()];
        }));
  const Value loop_value = Value::object(loop);
  for (std::int64_t i = 0; i < n; ++i) {
    if (++iterations_ > limits_.max_loop_iterations) {
      throw InputError("loops ran more than " + std::to_string(limits_.max_loop_iterations) +
                       " iterations");
    }
    *index = i;
    a.set(Value::string("index"), Value::integer(i + 1));
    a.set(Value::string("index0"), Value::integer(i));
    a.set(Value::string("revindex"), Value::integer(n - i));
    a.set(Value::string("revindex0"), Value::integer(n - i - 1));
    a.set(Value::string("first"), Value::boolean(i == 0));
    a.set(Value::string("last"), Value::boolean(i == n - 1));
    a.set(Value::string("previtem"), i > 0 ? items[static_cast<std::size_t>(i - 1)]
                                           : Value::undefined("there is no previous item"));
    a.set(Value::string("nextitem"), i + 1 < n ? items[static_cast<std::size_t>(i + 1)]
                                               : Value::undefined("there is no next item"));
    ScopePtr inner = bind(items[static_cast<std::size_t>(i)]);
    inner->vars["loop"] = loop_value;
    if (exec(s.body, inner) == Flow::kBreak) break;
  }
}

Value Interpreter::define_macro(const Stmt& s, const ScopePtr& scope) {
  const Stmt* def = &s;
  ScopePtr closure = scope;
  charge(sizeof(ScopePtr));
  closure_scopes_.push_back(scope);
  return Value::function(s.kind == Stmt::Kind::kMacro ? s.name : "caller",
                         [def, closure](Interpreter& in, CallArgs& args) {
                           return in.call_macro(*def, closure, args);
                         });
}

Value Interpreter::call_macro(const Stmt& def, const ScopePtr& closure, CallArgs& args) {
  if (call_depth_ >= limits_.max_call_depth) {
    throw InputError("macro calls nested more than " + std::to_string(limits_.max_call_depth) +
                     " deep");
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = closure;
  std::vector<bool> bound(def.names.size(), false);
  std::vector<Value> varargs;
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    if (i < def.names.size()) {
      scope->vars[def.names[i]] = args.positional[i];
      bound[i] = true;
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  DictData extra;
  for (auto& [k, v] : args.keyword) {
    std::size_t i = 0;
    while (i < def.names.size() && def.names[i] != k) ++i;
    if (i < def.names.size()) {
      if (bound[i])
        throw InputError("macro '" + def.name + "' got multiple values for '" + k + "'");
      scope->vars[k] = v;
      bound[i] = true;
    } else if (k == "caller") {
      scope->vars["caller"] = v;
    } else {
      extra.set(Value::string(k), v);
    }
  }
  for (std::size_t i = 0; i < def.names.size(); ++i) {
    if (bound[i]) continue;
    scope->vars[def.names[i]] =
        def.defaults[i] ? eval(*def.defaults[i], scope)
                        : Value::undefined("parameter '" + def.names[i] + "' was not provided");
  }
  scope->vars["varargs"] = Value::list(std::move(varargs), true);
  scope->vars["kwargs"] = Value::dict(std::move(extra));
  ++call_depth_;
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec(def.body, scope);
  } catch (...) {
    out_ = saved;
    --call_depth_;
    throw;
  }
  out_ = saved;
  --call_depth_;
  return make_string(std::move(buf));
}

// --- expressions ----------------------------------------------------------------------------

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  const DepthGuard guard(*this);
  return located(e.line, e.col, [&] { return eval_uncaught(e, scope); });
}

void Interpreter::eval_args(const Expr& e, std::size_t first, const ScopePtr& scope,
                            CallArgs& out) {
  for (std::size_t i = first; i < e.args.size(); ++i)
    out.positional.push_back(eval(*e.args[i], scope));
  for (const auto& [k, v] : e.kwargs) out.keyword.emplace_back(k, eval(*v, scope));
}

Value Interpreter::apply_filter_chain(const Expr& chain, Value operand, const ScopePtr& scope) {
  // The chain nests outward: the innermost filter has the null operand.
  if (chain.args[0]) operand = apply_filter_chain(*chain.args[0], std::move(operand), scope);
  CallArgs args;
  eval_args(chain, 1, scope, args);
  return apply_filter(*this, chain.name, operand, args);
}

Value Interpreter::eval_uncaught(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
        const auto it = s->vars.find(e.name);
        if (it != s->vars.end()) return it->second;
      }
      return Value::undefined("'" + e.name + "' is undefined");
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) items.push_back(eval(*a, scope));
      return make_list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      DictData d;
      for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], scope);
        d.set(std::move(k), eval(*e.args[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case Expr::Kind::kGetAttr:
      return getattr(eval(*e.args[0], scope), e.name);
    case Expr::Kind::kGetItem: {
      const Value obj = eval(*e.args[0], scope);
      return getitem(obj, eval(*e.args[1], scope));
    }
    case Expr::Kind::kSlice:
      return slice(eval(*e.args[0], scope), e, scope);
    case Expr::Kind::kCall: {
      const Value fn = eval(*e.args[0], scope);
      CallArgs args;
      eval_args(e, 1, scope, args);
      return call(fn, args);
    }
    case Expr::Kind::kFilter: {
      const Value v = eval(*e.args[0], scope);
      CallArgs args;
      eval_args(e, 1, scope, args);
      return apply_filter(*this, e.name, v, args);
    }
    case Expr::Kind::kTest: {
      const Value v = eval(*e.args[0], scope);
      CallArgs args;
      eval_args(e, 1, scope, args);
      return Value::boolean(apply_test(*this, e.name, v, args));
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      const Value v = eval(*e.args[0], scope);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) {
        throw InputError("bad operand type for unary " +
                         std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" +
                         v.type_name() + "'");
      }
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::number(-v.as_double());
      return Value::integer(checked(sub_ovf, 0, v.as_int()));
    }
    case Expr::Kind::kNot:
      return Value::boolean(!eval(*e.args[0], scope).truthy());
    case Expr::Kind::kBinary: {
      const Value a = eval(*e.args[0], scope);
      return binary(e.name, a, eval(*e.args[1], scope));
    }
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Kind::kCompare: {
      Value left = eval(*e.args[0], scope);
      for (std::size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], scope);
        if (!compare(e.ops[i], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::kConcat: {
      std::string s;
      for (const ExprPtr& a : e.args) s += to_str(eval(*a, scope));
      return make_string(std::move(s));
    }
    case Expr::Kind::kCondExpr:
      if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if's condition was false and it has no else");
  }
  return Value();
}

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::integer(checked(add_ovf, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return make_string(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return make_list(std::move(items), a.as_list().tuple);
    }
    type_error("+", a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(checked(sub_ovf, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() - b.as_double());
    type_error("-", a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(checked(mul_ovf, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() * b.as_double());
    const Value& seq = b.is_integral() ? a : b;
    const Value& count = b.is_integral() ? b : a;
    if (count.is_integral() && (seq.is_string() || seq.is_list())) {
      const std::int64_t n = std::max<std::int64_t>(0, count.as_int());
      if (seq.is_string()) {
        const std::string& s = seq.as_string();
        if (!s.empty() && static_cast<std::uint64_t>(n) > limits_.max_output_bytes / s.size()) {
          throw InputError("string repetition exceeds the output limit");
        }
        std::string out;
        for (std::int64_t i = 0; i < n; ++i) out += s;
        return make_string(std::move(out));
      }
      const auto& items = seq.as_list().items;
      if (!items.empty() &&
          static_cast<std::uint64_t>(n) > limits_.max_total_bytes / items.size()) {
        throw InputError("list repetition exceeds the size limit");
      }
      std::vector<Value> out;
      for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
      return make_list(std::move(out), seq.as_list().tuple);
    }
    type_error("*", a, b);
  }
  if (op == "/") {
    if (!nums) type_error("/", a, b);
    if (b.as_double() == 0) throw InputError("division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return make_string(percent_format(a.as_string(), b));
    if (!nums) type_error(op, a, b);
    if (b.as_double() == 0) throw InputError("integer division or modulo by zero");
    if (ints) {
      return Value::integer(op == "//" ? floor_div(a.as_int(), b.as_int())
                                       : floor_mod(a.as_int(), b.as_int()));
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "//") return Value::number(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0) {
      if ((m < 0) != (y < 0)) m += y;
    } else {
      m = std::copysign(0.0, y);  // Python: a zero remainder takes the divisor's sign
    }
    return Value::number(m);
  }
  if (op == "**") {
    if (!nums) type_error("**", a, b);
    if (ints && b.as_int() >= 0) {
      // Square-and-multiply; overflow is an error where Python would grow a big int.
      std::int64_t base = a.as_int(), result = 1;
      for (std::int64_t e = b.as_int(); e > 0; e >>= 1) {
        if ((e & 1) != 0) result = checked(mul_ovf, result, base);
        if (e > 1) base = checked(mul_ovf, base, base);
      }
      return Value::integer(result);
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  throw InputError("unknown operator " + op);
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) {
        throw InputError("'in <string>' requires string as left operand, not " + a.type_name());
      }
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_list()) {
      for (const Value& x : b.as_list().items) {
        if (equals(a, x)) {
          found = true;
          break;
        }
      }
    } else if (b.is_dict()) {
      found = b.as_dict().find(a) != nullptr;
    } else if (!b.is_undefined()) {
      throw InputError("argument of type '" + b.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (op == "<") return less_than(a, b);
  if (op == ">") return less_than(b, a);
  if (op == "<=") return less_than(a, b) || equals(a, b);
  if (op == ">=") return less_than(b, a) || equals(a, b);
  throw InputError("unknown comparison " + op);
}

Value Interpreter::slice(const Value& obj, const Expr& e, const ScopePtr& scope) {
  std::optional<std::int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.args[static_cast<std::size_t>(i) + 1]) continue;
    const Value v = eval(*e.args[static_cast<std::size_t>(i) + 1], scope);
    if (v.is_none()) continue;
    if (!v.is_integral()) {
      throw InputError("slice indices must be integers or None, not " + v.type_name());
    }
    bounds[i] = v.as_int();
  }
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_string()) {
    const std::u32string u = utf8_decode(obj.as_string());
    std::u32string out;
    for (const std::size_t i : py_slice_indices(u.size(), bounds[0], bounds[1], bounds[2])) {
      out += u[i];
    }
    return make_string(utf8_encode(out));
  }
  if (obj.is_list()) {
    const auto& items = obj.as_list().items;
    std::vector<Value> out;
    for (const std::size_t i : py_slice_indices(items.size(), bounds[0], bounds[1], bounds[2])) {
      out.push_back(items[i]);
    }
    return make_list(std::move(out), obj.as_list().tuple);
  }
  // jinja2 reads a failed subscript as undefined.
  return Value::undefined("'" + obj.type_name() + "' object is not subscriptable");
}

// --- attribute and item access, calls, iteration ---------------------------------------------

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(obj);
    case Value::Kind::kDict: {
      if (auto m = method(*this, obj, name)) return *m;
      if (name.rfind("__", 0) != 0) {
        if (const Value* v = obj.as_dict().find(Value::string(name))) return *v;
      }
      break;
    }
    case Value::Kind::kObject:
      if (const Value* v = obj.as_object().attrs.find(Value::string(name))) return *v;
      break;
    default:
      if (auto m = method(*this, obj, name)) return *m;
  }
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    const Value* v = nullptr;
    try {
      v = obj.as_dict().find(key);
    } catch (const InputError&) {
      // unhashable key: jinja2 treats it as missing
    }
    if (v != nullptr) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
    const std::size_t len = obj.is_list() ? obj.as_list().items.size() : py_len(obj.as_string());
    std::int64_t i = key.as_int();
    if (i < 0) i += static_cast<std::int64_t>(len);
    if (i >= 0 && static_cast<std::size_t>(i) < len) {
      if (obj.is_list()) return obj.as_list().items[static_cast<std::size_t>(i)];
      const std::u32string one(1, utf8_decode(obj.as_string())[static_cast<std::size_t>(i)]);
      return Value::string(utf8_encode(one));
    }
  }
  if (key.is_string()) {
    if (obj.is_object()) return getattr(obj, key.as_string());
    if (auto m = method(*this, obj, key.as_string())) return *m;
  }
  return Value::undefined("'" + obj.type_name() + " object' has no item " + to_repr(key));
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (!fn.is_function()) throw InputError("'" + fn.type_name() + "' object is not callable");
  return fn.as_function().call(*this, args);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().size());
      for (const auto& [k, x] : v.as_dict().items()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      charge(py_len(v.as_string()) * sizeof(Value));
      std::vector<Value> chars;
      for (const char32_t c : utf8_decode(v.as_string())) {
        chars.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      }
      return chars;
    }
    default:
      throw InputError("'" + v.type_name() + "' object is not iterable");
  }
}

}  // namespace moebatch::jinja
