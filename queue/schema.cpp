#include "queue/schema.h"

#include <charconv>

#include "common/error.h"

namespace moebatch {

std::vector<Migration> parse_migrations(std::string_view text) {
  static constexpr std::string_view kMarker = "-- @migration ";
  std::vector<Migration> out;
  size_t pos = 0;
  int line_no = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    ++line_no;
    if (line.substr(0, kMarker.size()) == kMarker) {
      std::string_view num = line.substr(kMarker.size());
      int v = 0;
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
      if (ec != std::errc() || p != num.data() + num.size()) {
        throw Error("schema line " + std::to_string(line_no) + ": bad migration marker '" +
                    std::string(line) + "'");
      }
      if (v != static_cast<int>(out.size()) + 1) {
        throw Error("schema line " + std::to_string(line_no) + ": migration " + std::to_string(v) +
                    " out of order (expected " + std::to_string(out.size() + 1) + ")");
      }
      out.push_back({v, {}});
    } else if (!out.empty()) {
      out.back().sql.append(line).push_back('\n');
    }
    pos = end + 1;
  }
  for (const Migration& m : out) {
    if (m.sql.find_first_not_of(" \t\r\n") == std::string::npos) {
      throw Error("schema: migration " + std::to_string(m.version) + " has no SQL");
    }
  }
  if (out.empty()) throw Error("schema: no '-- @migration N' blocks found");
  return out;
}

}  // namespace moebatch
