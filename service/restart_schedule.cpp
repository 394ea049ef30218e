#include "service/restart_schedule.h"

#include <algorithm>
#include <ctime>
#include <sstream>

#include "common/error.h"

namespace moebatch {
namespace {

// One cron field: '*' (empty list) or comma-separated integers within [lo, hi].
std::vector<int> parse_field(const std::string& text, const char* name, int lo, int hi,
                             const std::string& spec) {
  if (text == "*") return {};
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < lo || v > hi) {
      throw InputError("restart_at '" + spec + "': " + name + " field '" + text +
                       "' must be '*' or numbers in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
    }
    out.push_back(v);
  }
  if (out.empty()) throw InputError("restart_at '" + spec + "': empty " + name + " field");
  std::sort(out.begin(), out.end());
  return out;
}

bool allowed(const std::vector<int>& list, int v) {
  return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
}

}  // namespace

RestartSchedule RestartSchedule::parse(const std::string& spec) {
  RestartSchedule s;
  s.spec_ = spec;
  if (spec.empty()) return s;
  s.enabled_ = true;
  if (spec.find(' ') == std::string::npos) {
    // "HH:MM": every day at that local time.
    const auto colon = spec.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 3 != spec.size() || colon > 2) {
      throw InputError("restart_at '" + spec + "': expected HH:MM or 'M H DOM MON DOW'");
    }
    s.hours_ = parse_field(spec.substr(0, colon), "hour", 0, 23, spec);
    s.minutes_ = parse_field(spec.substr(colon + 1), "minute", 0, 59, spec);
    if (s.hours_.empty() || s.minutes_.empty())
      throw InputError("restart_at '" + spec + "': HH:MM takes numbers, not '*'");
    return s;
  }
  std::stringstream ss(spec);
  std::vector<std::string> fields;
  std::string f;
  while (ss >> f) fields.push_back(f);
  if (fields.size() != 5)
    throw InputError("restart_at '" + spec + "': a cron expression has 5 fields");
  s.minutes_ = parse_field(fields[0], "minute", 0, 59, spec);
  s.hours_ = parse_field(fields[1], "hour", 0, 23, spec);
  s.days_ = parse_field(fields[2], "day-of-month", 1, 31, spec);
  s.months_ = parse_field(fields[3], "month", 1, 12, spec);
  s.weekdays_ = parse_field(fields[4], "day-of-week", 0, 7, spec);
  // cron accepts both 0 and 7 for Sunday.
  for (int& d : s.weekdays_)
    if (d == 7) d = 0;
  // A whole-wildcard minute would restart every minute: surely a typo in a nightly schedule.
  if (s.minutes_.empty())
    throw InputError("restart_at '" + spec + "': the minute field must name a minute");
  return s;
}

std::optional<int64_t> RestartSchedule::next_after(int64_t now_ms) const {
  if (!enabled_) return std::nullopt;
  // Walk minute by minute through local time. Going through mktime for each candidate keeps
  // daylight-saving changes right (a skipped 02:30 simply never matches); a year of minutes is
  // ~527k cheap iterations, and the minute list lets us jump to the next candidate hour.
  std::time_t t = static_cast<std::time_t>(now_ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  tm.tm_sec = 0;
  tm.tm_min += 1;
  tm.tm_isdst = -1;
  for (int i = 0; i < 366 * 24 * 60; ++i) {
    std::tm probe = tm;
    const std::time_t when = std::mktime(&probe);
    if (when == static_cast<std::time_t>(-1)) return std::nullopt;
    if (allowed(months_, probe.tm_mon + 1) && allowed(days_, probe.tm_mday) &&
        allowed(weekdays_, probe.tm_wday) && allowed(hours_, probe.tm_hour) &&
        allowed(minutes_, probe.tm_min)) {
      const int64_t ms = static_cast<int64_t>(when) * 1000;
      if (ms > now_ms) return ms;
    }
    tm = probe;
    tm.tm_isdst = -1;
    // Outside an allowed hour, skip to the next hour boundary.
    if (!allowed(hours_, probe.tm_hour) || !allowed(days_, probe.tm_mday) ||
        !allowed(months_, probe.tm_mon + 1) || !allowed(weekdays_, probe.tm_wday)) {
      tm.tm_min = 60;
    } else {
      tm.tm_min += 1;
    }
  }
  return std::nullopt;
}

}  // namespace moebatch
