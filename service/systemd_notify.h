// systemd's service notification protocol (sd_notify(3)) for `Type=notify` units: READY=1 once
// serving, STATUS= lines, WATCHDOG=1 pings at half of WATCHDOG_USEC, STOPPING=1 at a stop.
// Outside systemd (no $NOTIFY_SOCKET) every call does nothing. Built with libsystemd when its
// header is found (MOEBATCH_HAVE_SYSTEMD); without it the notifier is inert, and a process
// started with $NOTIFY_SOCKET says once that it cannot answer.
//
// Thread-safety: the service calls it from its io thread only.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace moebatch {

/// The notifications of one process; see the file comment.
class SystemdNotifier {
 public:
  SystemdNotifier();

  /// True when the process was started by systemd with a notification socket (and the build
  /// can use it).
  bool active() const { return active_; }
  /// The watchdog ping period (half of $WATCHDOG_USEC), when systemd asked for pings.
  std::optional<std::chrono::milliseconds> watchdog_interval() const { return watchdog_; }

  /// READY=1 with a STATUS= line.
  void ready(const std::string& status);
  /// A STATUS= line (shown by `systemctl status`).
  void status(const std::string& status);
  /// WATCHDOG=1.
  void watchdog();
  /// STOPPING=1 with a STATUS= line.
  void stopping(const std::string& status);

  /// True when this build links libsystemd.
  static bool built_with_systemd();

 private:
  void send(const std::string& state);

  bool active_ = false;
  std::optional<std::chrono::milliseconds> watchdog_;
};

}  // namespace moebatch
