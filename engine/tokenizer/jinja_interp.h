// The evaluator: walks the AST against a chain of scopes, writing into an output buffer.
// Scoping follows jinja2: each `for` iteration, macro call, call/filter/set block and `with`
// body gets a child scope whose assignments vanish at its end (hence namespace() in templates);
// `if` bodies share their parent's scope. One Interpreter serves one render.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja.h"
#include "engine/tokenizer/jinja_ast.h"
#include "engine/tokenizer/jinja_value.h"

namespace moebatch::jinja {

/// Variables of one scope; lookups fall through to the parent.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  Interpreter(const Limits& limits, std::chrono::system_clock::time_point now)
      : limits_(limits), now_(now) {}

  /// Renders `body` with `vars` (over the globals) as the top-level scope.
  std::string run(const Body& body, const std::vector<std::pair<std::string, Value>>& vars);

  // The operations filters, tests and methods share with the evaluator.

  /// obj.name, as jinja2's sandboxed getattr (attribute first, then item).
  Value getattr(const Value& obj, const std::string& name);
  /// obj[key], as jinja2's sandboxed getitem (item first, then attribute).
  Value getitem(const Value& obj, const Value& key);
  /// fn(args); error if fn is not callable.
  Value call(const Value& fn, CallArgs& args);
  /// Python iteration: list items, dict keys, str code points; undefined yields nothing.
  std::vector<Value> iterate(const Value& v);
  /// A string result, charged to the render's budget (error when over the limits).
  Value make_string(std::string s);
  /// A list result, charged to the render's budget.
  Value make_list(std::vector<Value> items, bool tuple = false);
  /// Charges `bytes` to the render's budget of built strings and lists.
  void charge(std::size_t bytes);
  /// What strftime_now() formats.
  std::chrono::system_clock::time_point now() const { return now_; }
  const Limits& limits() const { return limits_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body, const ScopePtr& scope);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope);
  void exec_for(const Stmt& s, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_uncaught(const Expr& e, const ScopePtr& scope);
  void eval_args(const Expr& e, std::size_t first, const ScopePtr& scope, CallArgs& out);
  Value apply_filter_chain(const Expr& chain, Value operand, const ScopePtr& scope);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
  Value slice(const Value& obj, const Expr& e, const ScopePtr& scope);
  Value define_macro(const Stmt& s, const ScopePtr& scope);
  Value call_macro(const Stmt& def, const ScopePtr& closure, CallArgs& args);
  /// Runs `body` in a child scope with output captured.
  std::string capture(const Body& body, const ScopePtr& scope);
  void assign(const Stmt& s, const Value& v, Scope& scope);
  void emit(std::string_view s);
  /// Empties every scope a macro closed over (and their parents) and every namespace that was
  /// given a container or callable: what a reference cycle must pass through.
  void break_cycles();

  /// Counts one level of evaluation recursion for its lifetime; error past max_eval_depth.
  class DepthGuard {
   public:
    explicit DepthGuard(Interpreter& in);
    ~DepthGuard() { --in_.eval_depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Interpreter& in_;
  };

  const Limits& limits_;
  std::chrono::system_clock::time_point now_;
  std::string* out_ = nullptr;  // where output goes now (macros and blocks capture)
  std::size_t total_bytes_ = 0;
  std::uint64_t iterations_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  // Values are shared_ptr graphs, and a render can close them into cycles that would outlive it:
  // a macro stored in the scope it closes over (every `{% macro %}`), a namespace holding
  // itself or a macro. run() breaks them through these when it ends, however it ends.
  std::vector<ScopePtr> closure_scopes_;
  std::vector<std::shared_ptr<ObjectData>> namespaces_;
};

/// An error for using an undefined value the way jinja2's Undefined refuses.
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace moebatch::jinja
