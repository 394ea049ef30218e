// Tokens -> statements, following jinja2's grammar and operator precedence (filters and `is`
// tests bind tighter than arithmetic; `not` looser than comparisons; ** is left-associative).
#pragma once

#include <vector>

#include "engine/tokenizer/jinja.h"
#include "engine/tokenizer/jinja_ast.h"
#include "engine/tokenizer/jinja_lexer.h"

namespace moebatch::jinja {

/// The template's statements. InputError "line L:C: ..." on a syntax error.
Body parse_tokens(const std::vector<Token>& tokens, const Limits& limits);

}  // namespace moebatch::jinja
