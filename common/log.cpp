#include "common/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <ctime>

#include "common/error.h"

namespace moebatch {
namespace {

constexpr const char* kTextPattern = "%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ [%t] %v";

std::atomic<bool> g_json{false};  // mirrors the formatter installed on the default logger

// Length of the well-formed UTF-8 sequence at s[i], or 0 when it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3f);
  }
  // overlong forms, surrogates and values past U+10FFFF
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

// A JSON string: control characters escaped, bytes that are not UTF-8 become U+FFFD, so a
// line always parses and is always one line.
void append_json_string(std::string_view s, spdlog::memory_buf_t& out) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      out.append(std::string_view("\\ufffd"));
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(s.substr(i, n));
    } else if (c == '"') {
      out.append(std::string_view("\\\""));
    } else if (c == '\\') {
      out.append(std::string_view("\\\\"));
    } else if (c == '\n') {
      out.append(std::string_view("\\n"));
    } else if (c < 0x20 || c == 0x7f) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
    i += n;
  }
  out.push_back('"');
}

// One JSON object per line.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - secs);
    const std::time_t t = static_cast<std::time_t>(secs.count());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char ts[96];
    std::snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03d+00:00", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms.count()));
    fmt::format_to(std::back_inserter(dest),
                   "{{\"time\":\"{}\",\"level\":\"{}\",\"thread\":{},\"msg\":", ts,
                   spdlog::level::to_string_view(msg.level), msg.thread_id);
    append_json_string(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

void throw_check_failure(std::string_view what, std::string_view expr, const char* file, int line) {
  std::string msg(what);
  msg += " (";
  msg += expr;
  msg += ") at ";
  msg += file;
  msg += ":";
  msg += std::to_string(line);
  throw Error(msg);
}

void init_logging(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (lvl == spdlog::level::off && level != "off") {
    throw InputError("unknown log level '" + level +
                     "' (expected trace|debug|info|warn|error|critical|off)");
  }
  // Logs go to stderr so stdout stays clean for --json output and pipes. Called again (e.g. by
  // --log-level after the default setup) it only changes the level.
  if (!spdlog::get("moebatch")) {
    auto logger = spdlog::stderr_color_mt("moebatch");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern(kTextPattern, spdlog::pattern_time_type::utc);
  }
  spdlog::set_level(lvl);
}

void set_log_format(const std::string& format) {
  if (format != "text" && format != "json")
    throw InputError("unknown log format '" + format + "' (expected text|json)");
  if (!spdlog::get("moebatch")) init_logging("info");
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  } else {
    spdlog::set_pattern(kTextPattern, spdlog::pattern_time_type::utc);
  }
  g_json = format == "json";
}

bool log_format_json() { return g_json.load(); }

}  // namespace moebatch
