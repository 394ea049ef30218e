// Template source -> tokens, with jinja2's whitespace rules as transformers configures them:
// trim_blocks (the newline after a block or comment tag is dropped), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line are dropped), `-` on a tag strips
// all whitespace on that side, `+` disables lstrip. Newlines are normalised to \n and one
// trailing newline is dropped (keep_trailing_newline=False).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moebatch::jinja {

/// One token; `line` and `col` (1-based, code points) locate its first character.
struct Token {
  enum class Type : std::uint8_t {
    kText,        ///< literal template text (value)
    kVarBegin,    ///< {{
    kVarEnd,      ///< }}
    kBlockBegin,  ///< {%
    kBlockEnd,    ///< %}
    kName,        ///< identifier or keyword (value)
    kString,      ///< string literal, unescaped (value)
    kInt,         ///< integer literal (int_value)
    kFloat,       ///< float literal (float_value)
    kOp,          ///< operator or punctuation (value)
    kEof,
  };
  Type type = Type::kEof;
  std::string value;
  std::int64_t int_value = 0;
  double float_value = 0;
  int line = 0;
  int col = 0;
};

/// Tokens of `source` (valid UTF-8), ending with kEof. InputError "line L:C: ..." on a lexical
/// error (unterminated tag, string or comment; unbalanced bracket; unexpected character).
std::vector<Token> lex(std::string_view source);

}  // namespace moebatch::jinja
