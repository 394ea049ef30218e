// When the nightly maintenance cycle runs: "HH:MM" in local time, or a cron-like expression
// "M H DOM MON DOW" whose fields are '*', a number, or a comma list of numbers (no ranges or
// steps). Times are computed from an injected "now" so tests can place the clock anywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moebatch {

/// A parsed restart schedule. Empty (never fires) when built from an empty string.
class RestartSchedule {
 public:
  /// Parses `spec`; InputError naming the field on a bad expression. Empty spec = off.
  static RestartSchedule parse(const std::string& spec);

  /// First scheduled time strictly after `now_ms` (ms since the epoch, evaluated in the local
  /// time zone), or nullopt when off. Searches up to 366 days ahead.
  std::optional<int64_t> next_after(int64_t now_ms) const;

  /// True when a schedule is set.
  bool enabled() const { return enabled_; }
  /// The expression as given.
  const std::string& spec() const { return spec_; }

 private:
  bool enabled_ = false;
  std::string spec_;
  // Allowed values per field; an empty list means '*'.
  std::vector<int> minutes_, hours_, days_, months_, weekdays_;
};

}  // namespace moebatch
