// Logging setup. Components take a logger explicitly where it matters; the default spdlog logger
// is configured once by the CLI's main() and is the only process-wide logging state.
#pragma once

#include <string>

namespace moebatch {

/// Parses "trace|debug|info|warn|error|critical|off"; throws InputError on anything else.
void init_logging(const std::string& level);

}  // namespace moebatch
