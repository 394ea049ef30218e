#include "service/multipart.h"

#include <cctype>

namespace moebatch {
namespace {

constexpr size_t kMaxParts = 16;
constexpr size_t kMaxPartHeaderBytes = 8 << 10;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of `key` among "; key=value" parameters (quoted or not, whitespace around each part
// dropped); empty when absent. Parameters are read one after another: a quoted value may hold
// ';' and "key=" (a filename "a; name=x.jsonl"), which a search for "; name=" would take for
// the next parameter. A quoted value is an RFC 9110 quoted-string: a backslash takes the next
// character as it is (httpx, which the OpenAI Python SDK sends with, writes a filename's '\' as
// "\\"; `\"` is a quote inside the value, not its end).
std::string param(std::string_view header, std::string_view key) {
  size_t p = header.find(';');
  while (p != std::string_view::npos) {
    const std::string_view rest = header.substr(p + 1);
    const size_t eq = rest.find_first_of("=;");
    if (eq == std::string_view::npos) break;
    if (rest[eq] == ';') {  // a parameter without a value
      p += 1 + eq;
      continue;
    }
    const bool wanted = lower(trim(rest.substr(0, eq))) == key;
    std::string_view v = rest.substr(eq + 1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    std::string value;
    size_t end = 0;  // in v, past the value
    if (!v.empty() && v.front() == '"') {
      end = v.size();  // unclosed: the rest of the header
      for (size_t i = 1; i < v.size(); ++i) {
        if (v[i] == '\\' && i + 1 < v.size()) {
          if (wanted) value += v[i + 1];
          ++i;
        } else if (v[i] == '"') {
          end = i + 1;
          break;
        } else if (wanted) {
          value += v[i];
        }
      }
    } else {
      end = std::min(v.find(';'), v.size());
      if (wanted) value = trim(v.substr(0, end));
    }
    if (wanted) return value;
    p = header.find(';', static_cast<size_t>(v.data() - header.data()) + end);
  }
  return {};
}

}  // namespace

std::string multipart_boundary(std::string_view content_type) {
  return param(content_type, "boundary");
}

std::variant<std::vector<MultipartPart>, std::string> parse_multipart(std::string_view content_type,
                                                                      std::string_view body) {
  if (lower(trim(content_type.substr(0, content_type.find(';')))) != "multipart/form-data")
    return std::string("Content-Type must be multipart/form-data");
  const std::string boundary = multipart_boundary(content_type);
  if (boundary.empty() || boundary.size() > 200) return std::string("missing or bad boundary");
  const std::string delim = "--" + boundary;
  size_t p = body.find(delim);
  if (p == std::string_view::npos) return std::string("no part starts with the boundary");
  std::vector<MultipartPart> parts;
  while (true) {
    p += delim.size();
    if (body.substr(p, 2) == "--") return parts;  // the closing delimiter
    if (body.substr(p, 2) != "\r\n") return std::string("malformed boundary line");
    p += 2;
    const size_t head_end = body.find("\r\n\r\n", p);
    if (head_end == std::string_view::npos || head_end - p > kMaxPartHeaderBytes)
      return std::string("malformed part headers");
    MultipartPart part;
    std::string_view headers = body.substr(p, head_end - p);
    bool disposition = false;
    while (!headers.empty()) {
      const size_t eol = std::min(headers.find("\r\n"), headers.size());
      const std::string_view line = headers.substr(0, eol);
      headers.remove_prefix(std::min(eol + 2, headers.size()));
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos) return std::string("malformed part header");
      const std::string name = lower(trim(line.substr(0, colon)));
      const std::string_view value = trim(line.substr(colon + 1));
      if (name == "content-disposition") {
        if (lower(value.substr(0, value.find(';'))) != "form-data")
          return std::string("part disposition must be form-data");
        part.name = param(value, "name");
        part.filename = param(value, "filename");
        disposition = true;
      } else if (name == "content-type") {
        part.content_type = std::string(value);
      }
    }
    if (!disposition || part.name.empty()) return std::string("a part has no form-data name");
    const size_t start = head_end + 4;
    const size_t end = body.find("\r\n" + delim, start);
    if (end == std::string_view::npos) return std::string("a part is not terminated");
    part.body = std::string(body.substr(start, end - start));
    parts.push_back(std::move(part));
    if (parts.size() > kMaxParts) return std::string("more than 16 parts");
    p = end + 2;
  }
}

}  // namespace moebatch
