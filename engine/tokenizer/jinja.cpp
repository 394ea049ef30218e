#include "engine/tokenizer/jinja.h"

#include "engine/tokenizer/jinja_interp.h"
#include "engine/tokenizer/jinja_lexer.h"
#include "engine/tokenizer/jinja_parser.h"
#include "engine/tokenizer/utf8.h"

namespace moebatch::jinja {

Template Template::parse(std::string_view source, const Limits& limits) {
  if (source.size() > limits.max_source_bytes) {
    throw InputError("template is " + std::to_string(source.size()) + " bytes, over the limit of " +
                     std::to_string(limits.max_source_bytes));
  }
  tok::utf8_require_valid(source, "template source");
  Template t;
  t.body_ = std::make_shared<const Body>(parse_tokens(lex(source), limits));
  t.limits_ = limits;
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& vars,
                             std::chrono::system_clock::time_point now) const {
  Interpreter in(limits_, now);
  return in.run(*body_, vars);
}

}  // namespace moebatch::jinja
