#include "service/systemd_notify.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#ifdef MOEBATCH_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace moebatch {
namespace {

// STATUS= is one line: a newline would end it and start another assignment.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

bool SystemdNotifier::built_with_systemd() {
#ifdef MOEBATCH_HAVE_SYSTEMD
  return true;
#else
  return false;
#endif
}

SystemdNotifier::SystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || *socket == '\0') return;
#ifdef MOEBATCH_HAVE_SYSTEMD
  active_ = true;
  uint64_t usec = 0;
  // > 0 only when $WATCHDOG_USEC is set and $WATCHDOG_PID, if set, is this process.
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 && usec > 0) {
    watchdog_ = std::chrono::milliseconds(std::max<uint64_t>(1, usec / 2000));
  }
#else
  spdlog::warn(
      "NOTIFY_SOCKET is set but this build has no libsystemd: no readiness or watchdog "
      "notifications (use Type=simple, or rebuild with libsystemd-dev installed)");
#endif
}

void SystemdNotifier::send(const std::string& state) {
  if (!active_) return;
#ifdef MOEBATCH_HAVE_SYSTEMD
  const int rc = sd_notify(/*unset_environment=*/0, state.c_str());
  if (rc < 0) spdlog::debug("sd_notify failed: {}", rc);
#else
  (void)state;
#endif
}

void SystemdNotifier::ready(const std::string& status) {
  send("READY=1\nSTATUS=" + one_line(status));
}

void SystemdNotifier::status(const std::string& status) { send("STATUS=" + one_line(status)); }

void SystemdNotifier::watchdog() { send("WATCHDOG=1"); }

void SystemdNotifier::stopping(const std::string& status) {
  send("STOPPING=1\nSTATUS=" + one_line(status));
}

}  // namespace moebatch
