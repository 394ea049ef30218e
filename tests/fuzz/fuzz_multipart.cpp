// One multipart/form-data upload as `POST /v1/files` hands it to parse_multipart
// (service/multipart.*): the input's first line is the Content-Type header value, the rest is
// the body (Beast gives a header value without CR or LF; the body is any bytes). A refusal is a
// non-empty reason that the service's 400 reply carries through unchanged; an accepted body has
// at most 16 parts, each named, with names bounded by the 8 KiB header limit, and each part's
// bytes are the input's between a blank line and the next "\r\n--boundary", in order. The same
// input parses the same twice, and the parts written back out with the same boundary parse back
// the same.
#include <nlohmann/json.hpp>
#include <optional>

#include "common/utf8.h"
#include "queue/job_validate.h"
#include "service/http_server.h"
#include "service/multipart.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using moebatch::MultipartPart;
using nlohmann::json;
using Parsed = std::variant<std::vector<MultipartPart>, std::string>;

constexpr size_t kMaxParts = 16;
constexpr size_t kMaxPartHeaderBytes = 8 << 10;

bool same_parts(const std::vector<MultipartPart>& a, const std::vector<MultipartPart>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].filename != b[i].filename ||
        a[i].content_type != b[i].content_type || a[i].body != b[i].body)
      return false;
  return true;
}

bool same(const Parsed& a, const Parsed& b) {
  if (a.index() != b.index()) return false;
  if (a.index() == 1) return std::get<1>(a) == std::get<1>(b);
  return same_parts(std::get<0>(a), std::get<0>(b));
}

// A 400 reply quoting `message` (printed leniently, as every reply) reads back strictly with the
// message as it was when that is UTF-8; the reply never fails to print.
void check_reply(const std::string& message, bool must_be_exact) {
  const moebatch::HttpReply r = moebatch::json_error(400, message, "invalid_request_error");
  const json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("error") || !j["error"]["message"].is_string())
    __builtin_trap();
  if (must_be_exact && j["error"]["message"] != message) __builtin_trap();
}

// Each part's bytes lie in the body, in order, after a blank line ending its headers and before
// "\r\n--boundary", and hold no "\r\n--boundary" themselves.
void check_positions(std::string_view body, const std::string& boundary,
                     const std::vector<MultipartPart>& parts) {
  const std::string term = "\r\n--" + boundary;
  size_t from = body.find("--" + boundary);
  if (from == std::string_view::npos) __builtin_trap();
  for (const MultipartPart& part : parts) {
    if (part.body.find(term) != std::string::npos) __builtin_trap();
    const size_t n = part.body.size();
    size_t e = body.find(term, from);
    while (e != std::string_view::npos &&
           !(e >= n + 4 && e - n - 4 >= from && body.compare(e - n - 4, 4, "\r\n\r\n") == 0 &&
             body.compare(e - n, n, part.body) == 0))
      e = body.find(term, e + 1);
    if (e == std::string_view::npos) __builtin_trap();
    from = e + 2;
  }
}

// `v` as a Content-Disposition parameter value that reads back as `v`: a quoted-string, its
// quotes and backslashes escaped (the header is one line, so `v` holds no line break).
std::optional<std::string> param_value(const std::string& v) {
  std::string out = "\"";
  for (const char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The parts written out as a client would, with the same Content-Type; nullopt when a name
// cannot be spelled.
std::optional<std::string> encode(const std::string& boundary,
                                  const std::vector<MultipartPart>& parts) {
  std::string out;
  for (const MultipartPart& p : parts) {
    const auto name = param_value(p.name);
    if (!name) return std::nullopt;
    out += "--" + boundary + "\r\nContent-Disposition: form-data; name=" + *name;
    if (!p.filename.empty()) {
      const auto filename = param_value(p.filename);
      if (!filename) return std::nullopt;
      out += "; filename=" + *filename;
    }
    out += "\r\n";
    if (!p.content_type.empty()) out += "Content-Type: " + p.content_type + "\r\n";
    out += "\r\n" + p.body + "\r\n";
  }
  return out + "--" + boundary + "--\r\n";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = moebatch::fuzz::as_text(data, size);
  const size_t nl = input.find('\n');
  const std::string_view ct = input.substr(0, nl);
  const std::string_view body = nl == std::string_view::npos ? "" : input.substr(nl + 1);

  const Parsed parsed = moebatch::parse_multipart(ct, body);
  if (!same(parsed, moebatch::parse_multipart(ct, body))) __builtin_trap();
  if (const auto* reason = std::get_if<std::string>(&parsed)) {
    if (reason->empty() || !moebatch::is_valid_utf8(*reason)) __builtin_trap();
    check_reply("multipart body: " + *reason, true);
    return 0;
  }
  const auto& parts = std::get<std::vector<MultipartPart>>(parsed);
  if (parts.size() > kMaxParts) __builtin_trap();
  for (const MultipartPart& p : parts)
    if (p.name.empty() || p.name.size() > kMaxPartHeaderBytes ||
        p.filename.size() > kMaxPartHeaderBytes || p.content_type.size() > kMaxPartHeaderBytes)
      __builtin_trap();
  const std::string boundary = moebatch::multipart_boundary(ct);
  check_positions(body, boundary, parts);

  // What files_upload quotes from an upload: the purpose (any bytes) in its refusal.
  for (const MultipartPart& p : parts)
    if (p.name == "purpose")
      check_reply(
          "purpose: only 'batch' is supported, got '" + moebatch::utf8_prefix(p.body, 64) + "'",
          false);

  if (const auto again = encode(boundary, parts)) {
    const Parsed back = moebatch::parse_multipart(ct, *again);
    if (back.index() != 0 || !same_parts(std::get<0>(back), parts)) __builtin_trap();
  }
  return 0;
}
