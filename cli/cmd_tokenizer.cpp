// CLI commands of the tokenizer module: tokenize, detokenize.
#include "cli/commands.h"

namespace moebatch::cli {

void register_tokenizer_commands(CLI::App& app) { (void)app; }

}  // namespace moebatch::cli
