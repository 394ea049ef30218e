// A Jinja engine for Hugging Face chat templates: the subset of jinja2 that transformers'
// apply_chat_template renders with (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loop controls, `generation` blocks, its tojson), reproduced byte for byte. What is covered and
// what is not: docs/chat_templates.md. No packaged C++ library renders these templates the way
// jinja2 does, hence this one.
//
//   jinja_lexer    source -> tokens (whitespace control)
//   jinja_parser   tokens -> AST (jinja_ast.h); syntax errors carry line:column
//   jinja_interp   AST + variables -> text, within Limits
//   jinja_filters, jinja_tests, jinja_methods: what templates call by name (jinja_builtins.h)
//   jinja_strings  Python str semantics over UTF-8
//   jinja_value    the Python-like values, str()/repr()/json.dumps()
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "engine/tokenizer/jinja_value.h"

namespace moebatch::jinja {

struct Stmt;

/// Bounds against hostile templates. A template that passes them renders as jinja2 would.
struct Limits {
  std::size_t max_source_bytes = std::size_t{1} << 20;  ///< template source size
  int max_nesting = 100;  ///< nested blocks and nested expressions, when parsing
  std::size_t max_output_bytes = std::size_t{16} << 20;  ///< the rendering, and any one string
  std::size_t max_total_bytes = std::size_t{256}
                                << 20;            ///< all strings and lists one render builds
  std::uint64_t max_loop_iterations = 1'000'000;  ///< `for` iterations over one render
  int max_call_depth = 64;                        ///< nested macro calls
  int max_eval_depth = 1000;  ///< statements and expressions being evaluated, nested (C++ stack)
  std::int64_t max_range = 100'000;  ///< range() length (jinja2's sandbox MAX_RANGE)
};

/// raise_exception(message) called by the template; what() is the message itself.
class RaisedError : public InputError {
 public:
  using InputError::InputError;
};

/// A parsed template. Immutable; render() may run on several threads at once.
class Template {
 public:
  /// Parses `source` (UTF-8). InputError "line L:C: ..." on a syntax error, an unknown tag, or
  /// a filter or test jinja2 does not define (outside an `if`, where jinja2 defers the check).
  static Template parse(std::string_view source, const Limits& limits = {});

  /// Renders with `vars` as top-level variables; `now` is what strftime_now() formats (UTC).
  /// InputError "line L:C: ..." for a failure the template hits (undefined attribute of an
  /// undefined value, type errors, limits); RaisedError for raise_exception().
  std::string render(const std::vector<std::pair<std::string, Value>>& vars,
                     std::chrono::system_clock::time_point now) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
  Limits limits_;
};

}  // namespace moebatch::jinja
