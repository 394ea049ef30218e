// CLI commands of the engine module: logits, generate.
#include "cli/commands.h"

namespace moebatch::cli {

void register_engine_commands(CLI::App& app) { (void)app; }

}  // namespace moebatch::cli
