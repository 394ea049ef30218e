// The service as a plain process for the process tests: the same flags and config file as
// `moebatch serve`, nothing else (so the tests do not depend on the ingress being built).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/error.h"
#include "common/log.h"
#include "service/config.h"
#include "service/service.h"

int main(int argc, char** argv) {
  CLI::App app{"moebatch service daemon (test harness)"};
  auto flags = moebatch::add_service_flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    moebatch::init_logging("info");
    moebatch::Service service(moebatch::finish_service_flags(*flags, app));
    return service.run();
  } catch (const moebatch::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
