// Logging setup. Components take a logger explicitly where it matters; the default spdlog logger
// is configured once by the CLI's main() and is the only process-wide logging state.
//
// Every line carries a UTC timestamp with its offset (2026-12-01T03:00:00.125+00:00). Text:
// "<time> <level> [<thread>] <message>"; JSON: one object per line,
// {"time": ..., "level": ..., "thread": ..., "msg": ...}.
#pragma once

#include <string>

namespace moebatch {

/// Parses "trace|debug|info|warn|error|critical|off"; throws InputError on anything else.
void init_logging(const std::string& level);

/// "text" (default) or "json"; throws InputError on anything else. Sets up logging first if
/// init_logging has not run.
void set_log_format(const std::string& format);

/// True when lines are written as JSON (progress bars and other terminal output stay off).
bool log_format_json();

}  // namespace moebatch
