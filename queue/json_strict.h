// JSON from producers, parsed strictly. nlohmann's parser keeps the last of two equal keys in an
// object, while other parsers keep the first: a request read one way by a proxy and another way
// here is refused instead ({"max_tokens": 1, "max_tokens": 9000}). Keys holding a NUL byte are
// refused too: they cannot be told apart from a shorter key in C-string APIs and logs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace moebatch {

/// Parses text as JSON. On success returns the value and leaves *problem empty; otherwise returns
/// a discarded value and sets *problem to "not valid JSON", "duplicate key 'k'" or "key 'k'
/// holds a NUL byte". Never throws on bad input.
nlohmann::json parse_json_strict(std::string_view text, std::string* problem);

}  // namespace moebatch
