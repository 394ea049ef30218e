#include "engine/tokenizer/jinja_parser.h"

#include <initializer_list>
#include <string_view>

#include "common/error.h"
#include "engine/tokenizer/jinja_builtins.h"

namespace moebatch::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const Limits& limits) : t_(toks), limits_(limits) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().type != T::kEof) fail(cur(), "unexpected '" + describe(cur()) + "'");
    return body;
  }

 private:
  // --- token stream -----------------------------------------------------------------------

  const Token& cur() const { return t_[i_]; }
  const Token& peek(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(std::string_view op) const { return cur().type == T::kOp && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().type == T::kName && cur().value == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::kText:
        return "text";
      case T::kVarBegin:
        return "{{";
      case T::kVarEnd:
        return "}}";
      case T::kBlockBegin:
        return "{%";
      case T::kBlockEnd:
        return "%}";
      case T::kString:
        return "string";
      case T::kInt:
        return "integer";
      case T::kFloat:
        return "float";
      case T::kEof:
        return "end of template";
      default:
        return t.value;
    }
  }

  [[noreturn]] static void fail(const Token& at, const std::string& what) {
    throw InputError("line " + std::to_string(at.line) + ":" + std::to_string(at.col) + ": " +
                     what);
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op))
      fail(cur(), "expected '" + std::string(op) + "', got '" + describe(cur()) + "'");
  }
  std::string expect_name() {
    if (cur().type != T::kName) fail(cur(), "expected a name, got '" + describe(cur()) + "'");
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != T::kBlockEnd) fail(cur(), "expected '%}', got '" + describe(cur()) + "'");
    next();
  }

  /// Guards the recursion of nested blocks and expressions.
  struct Nest {
    Nest(Parser& p, const Token& at) : p_(p) {
      if (++p_.depth_ > p_.limits_.max_nesting) {
        fail(at, "nested more than " + std::to_string(p_.limits_.max_nesting) + " levels deep");
      }
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };

  ExprPtr node(Expr::Kind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  StmtPtr stmt(Stmt::Kind k, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  // --- statements -------------------------------------------------------------------------

  /// Statements up to `{% <one of stop> ...`; leaves the stop word as the current token.
  Body parse_body(std::initializer_list<std::string_view> stop) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == T::kEof) {
        if (stop.size() != 0) {
          fail(tk, "unexpected end of template, expected '" + std::string(*stop.begin()) + "'");
        }
        return body;
      }
      if (tk.type == T::kText) {
        auto s = stmt(Stmt::Kind::kText, tk);
        s->text = next().value;
        body.push_back(std::move(s));
      } else if (tk.type == T::kVarBegin) {
        next();
        auto s = stmt(Stmt::Kind::kOutput, tk);
        s->expr = parse_tuple(true, false, {});
        if (cur().type != T::kVarEnd) fail(cur(), "expected '}}', got '" + describe(cur()) + "'");
        next();
        body.push_back(std::move(s));
      } else if (tk.type == T::kBlockBegin) {
        const Token& word = peek();
        if (word.type != T::kName) fail(word, "expected a tag name, got '" + describe(word) + "'");
        for (const std::string_view s : stop) {
          if (word.value == s) {
            next();
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail(tk, "unexpected '" + describe(tk) + "'");
      }
    }
  }

  /// Current token is the tag name.
  StmtPtr parse_statement() {
    const Token& tk = cur();
    Nest nest(*this, tk);
    const std::string& w = tk.value;
    if (w == "if") return parse_if();
    if (w == "for") return parse_for();
    if (w == "set") return parse_set();
    if (w == "macro") return parse_macro();
    if (w == "call") return parse_call_block();
    if (w == "filter") return parse_filter_block();
    if (w == "generation" || w == "with") return parse_scope(w == "with");
    if (w == "break" || w == "continue") {
      if (loop_depth_ == 0) fail(tk, "'" + w + "' outside of a loop");
      auto s = stmt(w == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tk);
      next();
      expect_block_end();
      return s;
    }
    if (w == "include" || w == "import" || w == "from" || w == "extends" || w == "block" ||
        w == "do") {
      fail(tk, "tag '" + w + "' is not supported in chat templates");
    }
    fail(tk, "unknown tag '" + w + "'");
  }

  /// After the statement's own tokens: `%}`, the body, and the end tag `end<word>`.
  Body block_body(std::string_view end_word) {
    expect_block_end();
    const std::string end(end_word);
    Body b = parse_body({end});
    next();  // the end word
    expect_block_end();
    return b;
  }

  StmtPtr parse_if() {
    auto s = stmt(Stmt::Kind::kIf, cur());
    next();
    ++if_depth_;
    ExprPtr test = parse_tuple(false, false, {});
    expect_block_end();
    while (true) {
      Body b = parse_body({"elif", "else", "endif"});
      const std::string word = next().value;
      s->branches.emplace_back(std::move(test), std::move(b));
      if (word == "elif") {
        test = parse_tuple(false, false, {});
        expect_block_end();
      } else if (word == "else") {
        expect_block_end();
        Body e = parse_body({"endif"});
        next();
        expect_block_end();
        s->branches.emplace_back(nullptr, std::move(e));
        break;
      } else {
        expect_block_end();
        break;
      }
    }
    --if_depth_;
    return s;
  }

  /// `a`, `a, b` or `(a, b)`; sets `unpack` for a tuple.
  void parse_targets(Stmt& s) {
    const bool paren = skip_op("(");
    while (true) {
      s.names.push_back(expect_name());
      if (!skip_op(",")) break;
      s.unpack = true;
      if (cur().type != T::kName) break;  // trailing comma
    }
    if (paren) {
      expect_op(")");
      s.unpack = true;
    }
  }

  StmtPtr parse_for() {
    auto s = stmt(Stmt::Kind::kFor, cur());
    next();
    parse_targets(*s);
    if (!skip_name("in")) fail(cur(), "expected 'in', got '" + describe(cur()) + "'");
    s->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"});
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    const Token& at = cur();
    next();
    if (cur().type == T::kName && peek().type == T::kOp && peek().value == ".") {
      auto s = stmt(Stmt::Kind::kSetAttr, at);
      auto ns = node(Expr::Kind::kName, cur());
      ns->name = next().value;
      next();  // .
      s->name = expect_name();
      s->expr = std::move(ns);
      expect_op("=");
      s->value = parse_tuple(true, false, {});
      expect_block_end();
      return s;
    }
    auto s = stmt(Stmt::Kind::kSet, at);
    parse_targets(*s);
    if (skip_op("=")) {
      s->expr = parse_tuple(true, false, {});
      expect_block_end();
      return s;
    }
    if (s->unpack) fail(cur(), "a block set takes one name");
    s->kind = Stmt::Kind::kSetBlock;
    s->name = s->names.front();
    if (is_op("|")) s->cond = parse_filters(nullptr, false);
    s->body = block_body("endset");
    return s;
  }

  /// `(a, b=default, ...)` of a macro or call block.
  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.names.empty()) expect_op(",");
      if (is_op(")")) break;
      s.names.push_back(expect_name());
      s.defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    next();
  }

  StmtPtr parse_macro() {
    auto s = stmt(Stmt::Kind::kMacro, cur());
    next();
    s->name = expect_name();
    parse_params(*s);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = block_body("endmacro");
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = stmt(Stmt::Kind::kCallBlock, cur());
    next();
    if (is_op("(")) parse_params(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::kCall) fail(cur(), "expected a call after 'call'");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = block_body("endcall");
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = stmt(Stmt::Kind::kFilterBlock, cur());
    next();
    s->expr = parse_filters(nullptr, true);
    s->body = block_body("endfilter");
    return s;
  }

  StmtPtr parse_scope(bool with) {
    auto s = stmt(Stmt::Kind::kScope, cur());
    const std::string word = next().value;
    while (with && cur().type != T::kBlockEnd) {
      if (!s->names.empty()) expect_op(",");
      s->names.push_back(expect_name());
      expect_op("=");
      s->defaults.push_back(parse_expression(true));
    }
    s->body = block_body("end" + word);
    return s;
  }

  // --- expressions ------------------------------------------------------------------------

  bool tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& tk = cur();
    if (tk.type == T::kVarEnd || tk.type == T::kBlockEnd ||
        (tk.type == T::kOp && tk.value == ")")) {
      return true;
    }
    for (const std::string_view w : extra_end) {
      if (tk.type == T::kName && tk.value == w) return true;
    }
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens,
                      std::initializer_list<std::string_view> extra_end) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items.front());
      if (!explicit_parens) fail(cur(), "expected an expression, got '" + describe(cur()) + "'");
    }
    auto e = node(Expr::Kind::kTuple, at);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this, cur());
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = node(Expr::Kind::kCondExpr, next());
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, const Token& at, ExprPtr l, ExprPtr r, std::string op = {}) {
    auto e = node(k, at);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& at = next();
      e = binary(Expr::Kind::kOr, at, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& at = next();
      e = binary(Expr::Kind::kAnd, at, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this, cur());
      auto e = node(Expr::Kind::kNot, next());
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      const Token& tk = cur();
      if (tk.type == T::kOp && (tk.value == "==" || tk.value == "!=" || tk.value == "<" ||
                                tk.value == ">" || tk.value == "<=" || tk.value == ">=")) {
        ops.push_back(next().value);
      } else if (is_name("in")) {
        next();
        ops.push_back("in");
      } else if (is_name("not") && peek().type == T::kName && peek().value == "in") {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = node(Expr::Kind::kCompare, at);
    e->ops = std::move(ops);
    e->args.push_back(std::move(first));
    for (auto& r : rest) e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      e = binary(Expr::Kind::kBinary, at, std::move(e), parse_concat(), at.value);
    }
    return e;
  }

  ExprPtr parse_concat() {
    const Token& at = cur();
    ExprPtr e = parse_math2();
    if (!is_op("~")) return e;
    auto c = node(Expr::Kind::kConcat, at);
    c->args.push_back(std::move(e));
    while (skip_op("~")) c->args.push_back(parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      e = binary(Expr::Kind::kBinary, at, std::move(e), parse_pow(), at.value);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      e = binary(Expr::Kind::kBinary, at, std::move(e), parse_unary(true), "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this, cur());
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur());
      next();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case T::kName: {
        next();
        if (tk.value == "true" || tk.value == "True" || tk.value == "false" ||
            tk.value == "False") {
          auto e = node(Expr::Kind::kLiteral, tk);
          e->value = Value::boolean(tk.value == "true" || tk.value == "True");
          return e;
        }
        if (tk.value == "none" || tk.value == "None") {
          auto e = node(Expr::Kind::kLiteral, tk);
          e->value = Value::none();
          return e;
        }
        auto e = node(Expr::Kind::kName, tk);
        e->name = tk.value;
        return e;
      }
      case T::kString: {
        std::string s;
        while (cur().type == T::kString) s += next().value;  // adjacent literals concatenate
        auto e = node(Expr::Kind::kLiteral, tk);
        e->value = Value::string(std::move(s));
        return e;
      }
      case T::kInt:
      case T::kFloat: {
        next();
        auto e = node(Expr::Kind::kLiteral, tk);
        e->value =
            tk.type == T::kInt ? Value::integer(tk.int_value) : Value::number(tk.float_value);
        return e;
      }
      case T::kOp:
        if (tk.value == "(") {
          next();
          ExprPtr e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (tk.value == "[") return parse_list();
        if (tk.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail(tk, "unexpected '" + describe(tk) + "'");
  }

  ExprPtr parse_list() {
    auto e = node(Expr::Kind::kList, next());
    while (!is_op("]")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("]")) break;
      e->args.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_dict() {
    auto e = node(Expr::Kind::kDict, next());
    while (!is_op("}")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("}")) break;
      e->args.push_back(parse_expression(true));
      expect_op(":");
      e->args.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e), false);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& at = next();
    if (at.value == ".") {
      const Token& tk = cur();
      if (tk.type == T::kName) {
        auto e = node(Expr::Kind::kGetAttr, tk);
        e->name = next().value;
        e->args.push_back(std::move(obj));
        return e;
      }
      if (tk.type == T::kInt) {
        auto key = node(Expr::Kind::kLiteral, tk);
        key->value = Value::integer(next().int_value);
        auto e = node(Expr::Kind::kGetItem, tk);
        e->args.push_back(std::move(obj));
        e->args.push_back(std::move(key));
        return e;
      }
      fail(tk, "expected an attribute name, got '" + describe(tk) + "'");
    }
    // [key], [a:b:c] or [a, b] (a tuple key)
    std::vector<ExprPtr> keys;
    ExprPtr slice;
    while (!is_op("]")) {
      if (!keys.empty() || slice) expect_op(",");
      ExprPtr lo;
      if (!is_op(":")) {
        lo = parse_expression(true);
        if (!is_op(":")) {
          keys.push_back(std::move(lo));
          continue;
        }
      }
      next();  // first ':'
      slice = node(Expr::Kind::kSlice, at);
      slice->args.push_back(nullptr);  // object, filled below
      slice->args.push_back(std::move(lo));
      slice->args.push_back(is_op(":") || is_op("]") || is_op(",") ? nullptr
                                                                   : parse_expression(true));
      ExprPtr step;
      if (skip_op(":") && !is_op("]") && !is_op(",")) step = parse_expression(true);
      slice->args.push_back(std::move(step));
    }
    next();
    if (slice) {
      if (!keys.empty()) fail(at, "tuple keys with slices are not supported");
      slice->args[0] = std::move(obj);
      return slice;
    }
    if (keys.empty()) fail(at, "expected a subscript");
    auto e = node(Expr::Kind::kGetItem, at);
    e->args.push_back(std::move(obj));
    if (keys.size() == 1) {
      e->args.push_back(std::move(keys.front()));
    } else {
      auto t = node(Expr::Kind::kTuple, at);
      t->args = std::move(keys);
      e->args.push_back(std::move(t));
    }
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (e.args.size() > 1 || !e.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur(), "*args and **kwargs in calls are not supported");
      if (cur().type == T::kName && peek().type == T::kOp && peek().value == "=") {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail(cur(), "positional argument after a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::kCall, cur());
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == T::kName) {
      next();
      name += "." + next().value;
    }
    return name;
  }

  /// `| name(args) | ...`; with `inline_first` the first filter has no leading `|`.
  ExprPtr parse_filters(ExprPtr operand, bool inline_first) {
    while (inline_first || is_op("|")) {
      if (!inline_first) next();
      inline_first = false;
      auto e = node(Expr::Kind::kFilter, cur());
      e->name = dotted_name();
      if (if_depth_ == 0 && !has_filter(e->name)) fail(*e, "no filter named '" + e->name + "'");
      e->args.push_back(std::move(operand));
      if (is_op("(")) parse_call_args(*e);
      operand = std::move(e);
    }
    return operand;
  }

  ExprPtr parse_test(ExprPtr operand) {
    const Token& at = next();  // is
    const bool negated = skip_name("not");
    auto e = node(Expr::Kind::kTest, cur());
    e->name = dotted_name();
    if (if_depth_ == 0 && !has_test(e->name)) fail(*e, "no test named '" + e->name + "'");
    e->args.push_back(std::move(operand));
    const Token& tk = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((tk.type == T::kName || tk.type == T::kString || tk.type == T::kInt ||
                tk.type == T::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(tk, "cannot chain multiple tests with 'is'");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = node(Expr::Kind::kNot, at);
    n->args.push_back(std::move(e));
    return n;
  }

  [[noreturn]] static void fail(const Expr& at, const std::string& what) {
    throw InputError("line " + std::to_string(at.line) + ":" + std::to_string(at.col) + ": " +
                     what);
  }

  const std::vector<Token>& t_;
  const Limits& limits_;
  std::size_t i_ = 0;
  int depth_ = 0;
  int if_depth_ = 0;    // inside an `if`: unknown filters and tests fail only when evaluated
  int loop_depth_ = 0;  // inside a `for` of the current macro: break/continue allowed
};

}  // namespace

Body parse_tokens(const std::vector<Token>& tokens, const Limits& limits) {
  return Parser(tokens, limits).parse_all();
}

}  // namespace moebatch::jinja
