#include "engine/tokenizer/jinja_lexer.h"

#include <charconv>
#include <cstdlib>

#include "common/error.h"
#include "engine/tokenizer/jinja_strings.h"
#include "engine/tokenizer/utf8.h"

namespace moebatch::jinja {
namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/// Bytes of Python whitespace (str.isspace) starting at `pos`.
std::size_t ws_run(std::string_view s, std::size_t pos) {
  std::size_t i = pos;
  while (i < s.size()) {
    std::size_t j = i;
    if (!py_isspace(tok::utf8_next(s, j))) break;
    i = j;
  }
  return i - pos;
}

/// Python's str.rstrip() (all Unicode whitespace).
std::string_view rstrip_ws(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    std::size_t j = start;
    if (!py_isspace(tok::utf8_next(s, j))) break;
    end = start;
  }
  return s.substr(0, end);
}

// Longest first, so "//" is not read as two "/".
constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*",
                                           "/",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const std::size_t start = find_tag(pos_);
      if (start == std::string_view::npos) {
        emit_text(pos_, src_.substr(pos_));
        break;
      }
      const char kind = src_[start + 1];
      char sign = 0;
      if (start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')) {
        sign = src_[start + 2];
      }
      std::string_view text = src_.substr(pos_, start - pos_);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop whitespace between the line start and a block or comment tag.
        const std::size_t nl = text.rfind('\n');
        const std::size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        const std::string_view tail = text.substr(l_pos);
        if ((l_pos > 0 || line_starting) && !tail.empty() && ws_run(tail, 0) == tail.size()) {
          text = text.substr(0, l_pos);
        }
      }
      emit_text(pos_, text);
      const std::size_t inner = start + 2 + (sign != 0);
      std::size_t end = 0;
      if (kind == '#') {
        end = skip_comment(start, inner);
      } else if (kind == '%' && is_raw(inner)) {
        end = read_raw(start, inner);
      } else {
        end = read_tag(start, inner, kind);
      }
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos_ = end;
    }
    Token eof;
    eof.type = Token::Type::kEof;
    at(src_.size(), eof);
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(std::size_t p, const std::string& what) {
    Token t;
    at(p, t);
    throw InputError("line " + std::to_string(t.line) + ":" + std::to_string(t.col) + ": " + what);
  }

  /// Sets t's line and col for source position p (positions only move forward).
  void at(std::size_t p, Token& t) {
    for (; tracked_ < p && tracked_ < src_.size(); ++tracked_) {
      const char c = src_[tracked_];
      if (c == '\n') {
        ++line_;
        col_ = 1;
      } else if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
        ++col_;
      }
    }
    t.line = line_;
    t.col = col_;
  }

  void push(Token::Type type, std::size_t p, std::string value = {}) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    at(p, t);
    tokens_.push_back(std::move(t));
  }

  void emit_text(std::size_t p, std::string_view text) {
    if (!text.empty()) push(Token::Type::kText, p, std::string(text));
  }

  std::size_t find_tag(std::size_t from) const {
    for (std::size_t p = src_.find('{', from); p != std::string_view::npos;
         p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return std::string_view::npos;
  }

  std::size_t skip_comment(std::size_t start, std::size_t inner) {
    const std::size_t q = src_.find("#}", inner);
    if (q == std::string_view::npos) fail(start, "missing end of comment tag");
    std::size_t end = q + 2;
    const char before = q > inner ? src_[q - 1] : 0;
    if (before == '-') {
      end += ws_run(src_, end);
    } else if (before != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  bool is_raw(std::size_t inner) const {
    std::size_t p = inner;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    if (src_.substr(p, 3) != "raw") return false;
    p += 3;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    return src_.substr(p, 2) == "%}" || src_.substr(p, 3) == "-%}";
  }

  // {% raw %}...{% endraw %}: the body is text, untouched except by the tags' own `-` signs.
  std::size_t read_raw(std::size_t start, std::size_t inner) {
    std::size_t p = src_.find("raw", inner) + 3;
    while (is_ascii_space(src_[p])) ++p;
    const bool strip_after_open = src_[p] == '-';
    p += strip_after_open ? 3 : 2;
    if (strip_after_open) p += ws_run(src_, p);
    const std::size_t body = p;
    for (std::size_t q = src_.find("{%", p); q != std::string_view::npos;
         q = src_.find("{%", q + 2)) {
      std::size_t r = q + 2;
      const bool strip_before = r < src_.size() && src_[r] == '-';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) ++r;
      while (r < src_.size() && is_ascii_space(src_[r])) ++r;
      if (src_.substr(r, 6) != "endraw") continue;
      r += 6;
      while (r < src_.size() && is_ascii_space(src_[r])) ++r;
      std::size_t end = 0;
      if (src_.substr(r, 3) == "-%}") {
        end = r + 3 + ws_run(src_, r + 3);
      } else if (src_.substr(r, 3) == "+%}") {
        end = r + 3;
      } else if (src_.substr(r, 2) == "%}") {
        end = r + 2 + (r + 2 < src_.size() && src_[r + 2] == '\n');
      } else {
        continue;
      }
      std::string_view text = src_.substr(body, q - body);
      if (strip_before) text = rstrip_ws(text);
      emit_text(body, text);
      return end;
    }
    fail(start, "missing end of raw directive");
  }

  std::size_t read_tag(std::size_t start, std::size_t p, char kind) {
    const bool var = kind == '{';
    push(var ? Token::Type::kVarBegin : Token::Type::kBlockBegin, start);
    const int open_line = tokens_.back().line, open_col = tokens_.back().col;
    std::string closers;  // expected closing brackets, innermost last
    while (true) {
      while (p < src_.size() && is_ascii_space(src_[p])) ++p;
      if (p >= src_.size()) {
        throw InputError("line " + std::to_string(open_line) + ":" + std::to_string(open_col) +
                         ": unexpected end of template, expected '" + (var ? "}}" : "%}") + "'");
      }
      if (closers.empty()) {
        const std::string_view rest = src_.substr(p);
        const std::string_view close = var ? "}}" : "%}";
        if (rest.substr(0, 1) == "-" && rest.substr(1, 2) == close) {
          push(var ? Token::Type::kVarEnd : Token::Type::kBlockEnd, p);
          return p + 3 + ws_run(src_, p + 3);
        }
        if (!var && rest.substr(0, 3) == "+%}") {
          push(Token::Type::kBlockEnd, p);
          return p + 3;
        }
        if (rest.substr(0, 2) == close) {
          push(var ? Token::Type::kVarEnd : Token::Type::kBlockEnd, p);
          std::size_t end = p + 2;
          if (!var && end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
          return end;
        }
      }
      p = read_token(p, closers);
    }
  }

  std::size_t read_token(std::size_t p, std::string& closers) {
    const char c = src_[p];
    if (is_name_start(c)) {
      std::size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      push(Token::Type::kName, p, std::string(src_.substr(p, e - p)));
      return e;
    }
    if (is_digit(c)) return read_number(p);
    if (c == '\'' || c == '"') return read_string(p);
    for (const std::string_view op : kOperators) {
      if (src_.substr(p, op.size()) != op) continue;
      if (op == "(" || op == "[" || op == "{") {
        closers += op == "(" ? ')' : op == "[" ? ']' : '}';
      } else if (op == ")" || op == "]" || op == "}") {
        if (closers.empty()) fail(p, "unexpected '" + std::string(op) + "'");
        if (closers.back() != op[0]) {
          fail(p, "unexpected '" + std::string(op) + "', expected '" + closers.back() + "'");
        }
        closers.pop_back();
      }
      push(Token::Type::kOp, p, std::string(op));
      return p + op.size();
    }
    std::size_t e = p;
    tok::utf8_next(src_, e);
    fail(p, "unexpected character '" + std::string(src_.substr(p, e - p)) + "'");
  }

  // Digits with `_` separators; a float needs a fraction or an exponent, and is not read right
  // after a dot (so `x.0.1` is two subscripts, as in jinja2).
  std::size_t read_number(std::size_t p) {
    auto digits = [&](std::size_t i) {
      while (i < src_.size() && (is_digit(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() &&
                                                       is_digit(src_[i + 1])))) {
        ++i;
      }
      return i;
    };
    std::size_t e = digits(p);
    bool is_float = false;
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot) {
      if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        std::size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && is_digit(src_[x])) {
          e = digits(x);
          is_float = true;
        }
      }
    }
    std::string text;
    for (std::size_t i = p; i < e; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t;
    at(p, t);
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Token::Type::kInt;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (r.ec != std::errc()) fail(p, "integer literal " + text + " is too large");
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  // Python's unicode-escape decoding: \n \t \r \\ \' \" \a \b \f \v \ooo \xhh \uXXXX
  // \UXXXXXXXX and backslash-newline; any other backslash stays as written.
  std::size_t read_string(std::size_t p) {
    const char quote = src_[p];
    std::string out;
    std::size_t i = p + 1;
    auto hex = [&](std::size_t at, int n) -> char32_t {
      if (at + n > src_.size()) fail(p, "truncated escape in string literal");
      char32_t v = 0;
      for (int k = 0; k < n; ++k) {
        const char h = src_[at + k];
        const int d = is_digit(h)              ? h - '0'
                      : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                               : -1;
        if (d < 0) fail(p, "truncated escape in string literal");
        v = v * 16 + static_cast<char32_t>(d);
      }
      return v;
    };
    auto append_cp = [&](char32_t cp) {
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        fail(p, "invalid escape in string literal");
      tok::utf8_append_codepoint(cp, out);
    };
    while (true) {
      if (i >= src_.size()) fail(p, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail(p, "unterminated string literal");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          append_cp(hex(i, 2));
          i += 2;
          break;
        case 'u':
          append_cp(hex(i, 4));
          i += 4;
          break;
        case 'U':
          append_cp(hex(i, 8));
          i += 8;
          break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              v = v * 8 + static_cast<char32_t>(src_[i++] - '0');
            }
            append_cp(v);
          } else {
            out += '\\';
            i -= 1;  // the next character is read as itself
          }
      }
    }
    push(Token::Type::kString, p, std::move(out));
    return i + 1;
  }

  std::string_view src_;
  std::size_t pos_ = 0;
  std::vector<Token> tokens_;
  std::size_t tracked_ = 0;
  int line_ = 1;
  int col_ = 1;
};

}  // namespace

std::vector<Token> lex(std::string_view source) {
  // \r\n and \r become \n; one trailing newline is dropped.
  std::string norm;
  norm.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      norm += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      norm += source[i];
    }
  }
  if (!norm.empty() && norm.back() == '\n') norm.pop_back();
  return Lexer(norm).run();
}

}  // namespace moebatch::jinja
