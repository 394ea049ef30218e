// Subcommand registration. Each module's commands live in their own cli/cmd_*.cpp and attach to
// the root app here; main() only parses and maps errors to exit codes.
//
// Contract for a command callback: print results to stdout (human text, or JSON with --json),
// diagnostics to stderr via spdlog, and signal failure by throwing moebatch::InputError (bad
// input or usage: exit 2, as for a flag CLI11 refuses), moebatch::Error (exit 1) or
// CLI::RuntimeError(code) for a specific exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace moebatch::cli {

void register_queue_commands(CLI::App& app);      // submit, status, result, list, cancel, stats
void register_batch_commands(CLI::App& app);      // batch status|wait|cancel|retry|purge, export
void register_engine_commands(CLI::App& app);     // logits, generate
void register_tokenizer_commands(CLI::App& app);  // tokenize, detokenize
void register_chat_commands(CLI::App& app);       // render-chat
void register_service_commands(CLI::App& app);    // demo, queue-demo, maintenance
void register_serve_commands(CLI::App& app);      // serve (service + ZeroMQ ingress)

}  // namespace moebatch::cli
