// When the nightly maintenance cycle runs: "HH:MM" in local time, or a 5-field cron expression
// "M H DOM MON DOW" in local time with the syntax of cron(5): '*', numbers, ranges ("1-5"),
// lists ("0,30"), steps ("*/15", "0-30/10", "5/20"), month and weekday names ("jan", "mon-fri",
// any case), 0 or 7 for Sunday, and the macros @yearly, @annually, @monthly, @weekly, @daily,
// @midnight, @hourly. As in cron, when both day fields are restricted a day matching either one
// fires. Times are computed from an injected "now" so tests can place the clock anywhere.
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>

namespace moebatch {

/// A parsed restart schedule. Empty (never fires) when built from an empty string.
class RestartSchedule {
 public:
  /// Parses `spec`; InputError naming the field on a bad expression, and for an expression that
  /// can never fire ("0 3 31 2 *"). Empty spec = off.
  static RestartSchedule parse(const std::string& spec);

  /// First scheduled time strictly after `now_ms` (ms since the epoch, evaluated in the local
  /// time zone), or nullopt when off. Searches up to 8 years ahead (Feb 29 across a century).
  std::optional<int64_t> next_after(int64_t now_ms) const;

  /// True when a schedule is set.
  bool enabled() const { return enabled_; }
  /// The expression as given.
  const std::string& spec() const { return spec_; }

 private:
  bool day_allowed(int mday, int month, int wday) const;

  bool enabled_ = false;
  std::string spec_;
  // Allowed values per field (bit i = value i); Sunday is weekday 0.
  std::bitset<60> minutes_;
  std::bitset<24> hours_;
  std::bitset<32> days_;    // 1..31
  std::bitset<13> months_;  // 1..12
  std::bitset<7> weekdays_;
  // cron(5): a day field whose text starts with '*' does not restrict; when neither does, a day
  // matching either field is allowed.
  bool days_restricted_ = false;
  bool weekdays_restricted_ = false;
};

}  // namespace moebatch
