// CLI commands of the service module: serve, demo, maintenance.
#include "cli/commands.h"

namespace moebatch::cli {

void register_service_commands(CLI::App& app) { (void)app; }

}  // namespace moebatch::cli
