#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "common/error.h"
#include "common/log.h"

namespace {

// --log-level and --log-format on the root and on every subcommand, so that both
// `moebatch --log-level debug serve` and `moebatch serve --log-level debug` work.
void add_logging_options(CLI::App& app) {
  app.add_option_function<std::string>(
         "--log-level", [](const std::string& lvl) { moebatch::init_logging(lvl); },
         "Log verbosity: trace|debug|info|warn|error|critical|off (default info)")
      ->trigger_on_parse();
  app.add_option_function<std::string>(
         "--log-format", [](const std::string& f) { moebatch::set_log_format(f); },
         "Log lines as text (default) or json (one object per line); UTC timestamps")
      ->trigger_on_parse();
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    add_logging_options(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moebatch: batch inference for Mixture-of-Experts language models.\n"
      "Jobs go into a durable SQLite queue (CLI, ZeroMQ, or direct SQL INSERT); the service\n"
      "runs them in fixed-size batches on the in-process engine and writes results back.",
      "moebatch"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moebatch 0.1.0");
  try {
    moebatch::init_logging("info");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  moebatch::cli::register_queue_commands(app);
  moebatch::cli::register_batch_commands(app);
  moebatch::cli::register_engine_commands(app);
  moebatch::cli::register_tokenizer_commands(app);
  moebatch::cli::register_chat_commands(app);
  moebatch::cli::register_service_commands(app);
  moebatch::cli::register_serve_commands(app);
  add_logging_options(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    // Thrown by a command to choose its exit status; app.exit prints nothing for it.
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // --help and --version end parsing with code 0. Every other parse error is a usage error,
    // which exits 2 like an InputError, whatever CLI11's own code for it (104 for a failed
    // conversion, 106 for a missing option, ...); app.exit prints the message.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const moebatch::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
