// JSON from outside the process (requests, job rows, checkpoint headers and configs, tokenizer
// files): parsed with a bound on nesting, and quoted in error messages in short.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace moebatch {

/// The deepest nesting accepted. nlohmann's parser and destructor are iterative, but printing
/// (dump) and copying recurse once per level: a few hundred KB of "[[[[…" parse fine and then
/// overflow the stack when quoted in an error message or copied. Real documents nest far less
/// (tool JSON schemas, the deepest, a few tens of levels).
inline constexpr int kMaxJsonDepth = 128;

/// json::parse refusing nesting deeper than kMaxJsonDepth; never throws on bad input. On failure
/// returns a discarded value and, if `problem` is given, sets it to "not valid JSON (the parser's
/// words, with the byte offset)" or "nested deeper than 128 levels"; on success clears it.
nlohmann::json parse_json_bounded(std::string_view text, std::string* problem = nullptr);

/// True once a parser callback's (depth, event) opens a value nested deeper than kMaxJsonDepth.
/// For parsers with callbacks of their own (parse_json_strict).
inline bool json_too_deep(int depth, nlohmann::json::parse_event_t event) {
  return (event == nlohmann::json::parse_event_t::object_start ||
          event == nlohmann::json::parse_event_t::array_start) &&
         depth >= kMaxJsonDepth;
}

/// obj[key] when it holds a string; `fallback` when `obj` is not an object or the key is absent
/// or null; nullopt when the key holds another type. For optional string fields of outside JSON:
/// nlohmann's value(key, "") throws type_error 302 there, out of whatever parser called it.
std::optional<std::string> json_string_field(const nlohmann::json& obj, std::string_view key,
                                             std::string fallback = {});

/// `j` printed; bytes that are not UTF-8 become U+FFFD rather than an exception. For every JSON the
/// process writes that may quote outside text (replies, rows, files, messages): a strict dump
/// throws on a split character, which would fail whatever was being answered.
std::string dump_json(const nlohmann::json& j, int indent = -1);

/// `v` printed for an error message: at most `max_chars` characters, "…" marking a cut.
std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars = 120);

}  // namespace moebatch
