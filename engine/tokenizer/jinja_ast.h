// The parsed template: expression and statement nodes, one struct each with a kind, so the
// evaluator is two switches. Nodes are immutable once parsed and shared by every render.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja_value.h"

namespace moebatch::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// One expression. `args` holds the operands, laid out per kind as noted.
struct Expr {
  enum class Kind : std::uint8_t {
    kLiteral,   ///< value
    kName,      ///< name
    kList,      ///< args = items
    kTuple,     ///< args = items
    kDict,      ///< args = key0, value0, key1, value1, ...
    kGetAttr,   ///< args = {object}, name = attribute
    kGetItem,   ///< args = {object, key}
    kSlice,     ///< args = {object, start, stop, step} (null = omitted)
    kCall,      ///< args = {callee, positional...}, kwargs
    kFilter,    ///< args = {operand (null in a filter block), positional...}, kwargs, name
    kTest,      ///< args = {operand, positional...}, kwargs, name
    kNeg,       ///< args = {operand}
    kPos,       ///< args = {operand}
    kNot,       ///< args = {operand}
    kBinary,    ///< args = {left, right}, name = + - * / // % **
    kAnd,       ///< args = {left, right}
    kOr,        ///< args = {left, right}
    kCompare,   ///< args = {first, then one per op}, ops = == != < > <= >= in notin
    kConcat,    ///< args = parts joined with ~
    kCondExpr,  ///< args = {condition, then, else (null: undefined)}
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int col = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// One statement (text and {{ }} output count as statements).
struct Stmt {
  enum class Kind : std::uint8_t {
    kText,         ///< text
    kOutput,       ///< expr
    kIf,           ///< branches (condition null = else)
    kFor,          ///< names = loop targets, expr = iterable, cond = `if` filter, body, else_body
    kSet,          ///< names = targets, expr = value
    kSetAttr,      ///< expr = namespace, name = attribute, value = assigned value
    kSetBlock,     ///< name, body, cond = filter chain (operand null) or null
    kMacro,        ///< name, names = params, defaults, body
    kCallBlock,    ///< expr = the call, names/defaults = caller's params, body
    kFilterBlock,  ///< expr = filter chain (innermost operand null), body
    kScope,        ///< names/defaults = `with` assignments; body (also `generation`)
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  int col = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr value;
  ExprPtr cond;
  std::vector<std::string> names;
  std::vector<ExprPtr> defaults;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  bool unpack = false;  ///< the target was a tuple: unpack each value
};

}  // namespace moebatch::jinja
