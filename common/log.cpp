#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace moebatch {

void throw_check_failure(std::string_view what, std::string_view expr, const char* file,
                         int line) {
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
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  }
  spdlog::set_level(lvl);
}

}  // namespace moebatch
