// CLI command `serve`: the long-running daemon (ZeroMQ ingress over the job store).
#include "cli/commands.h"

namespace moebatch::cli {

void register_serve_commands(CLI::App& app) { (void)app; }

}  // namespace moebatch::cli
