#include "service/restart_schedule.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace moebatch {
namespace {

bool is_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

struct FieldSpec {
  const char* name;
  int lo, hi;
  const char* const* names;  // names[i] is value lo + i (months) or i (weekdays); may be null
  int name_count;
};

constexpr const char* kMonthNames[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                       "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr const char* kDayNames[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

constexpr FieldSpec kMinute{"minute", 0, 59, nullptr, 0};
constexpr FieldSpec kHour{"hour", 0, 23, nullptr, 0};
constexpr FieldSpec kDayOfMonth{"day-of-month", 1, 31, nullptr, 0};
constexpr FieldSpec kMonth{"month", 1, 12, kMonthNames, 12};
constexpr FieldSpec kDayOfWeek{"day-of-week", 0, 7, kDayNames, 7};

[[noreturn]] void bad_field(const std::string& spec, const FieldSpec& f, const std::string& text,
                            const std::string& why) {
  throw InputError("restart_at '" + spec + "': " + f.name + " field '" + text + "': " + why);
}

// One value: a decimal number in [lo, hi] or, where the field has them, a three-letter name.
int parse_value(const std::string& item, const FieldSpec& f, const std::string& text,
                const std::string& spec) {
  if (is_digits(item) && item.size() <= 4) {
    const int v = std::stoi(item);
    if (v < f.lo || v > f.hi)
      bad_field(spec, f, text,
                std::to_string(v) + " is outside [" + std::to_string(f.lo) + ", " +
                    std::to_string(f.hi) + "]");
    return v;
  }
  std::string lower(item);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (int i = 0; i < f.name_count; ++i) {
    if (lower == f.names[i]) return f.names == kMonthNames ? i + 1 : i;
  }
  bad_field(spec, f, text,
            "'" + item + "' is not a number" + (f.names ? " or a name" : std::string()));
}

// One cron field: comma list of '*', N, N-M, each optionally followed by /STEP; "N/STEP" runs
// from N to the field's maximum. Returns the allowed values as bits.
uint64_t parse_field(const std::string& text, const FieldSpec& f, const std::string& spec) {
  if (text.empty() || text.front() == ',' || text.back() == ',' ||
      text.find(",,") != std::string::npos)
    bad_field(spec, f, text, "empty list item");
  uint64_t bits = 0;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int step = 1;
    const auto slash = item.find('/');
    std::string range = item.substr(0, slash);
    if (slash != std::string::npos) {
      const std::string s = item.substr(slash + 1);
      if (!is_digits(s) || s.size() > 3 || std::stoi(s) == 0)
        bad_field(spec, f, text, "step '" + s + "' must be a positive number");
      step = std::stoi(s);
    }
    int first = f.lo, last = f.hi;
    if (range != "*") {
      const auto dash = range.find('-');
      first = parse_value(range.substr(0, dash), f, text, spec);
      if (dash != std::string::npos) {
        last = parse_value(range.substr(dash + 1), f, text, spec);
        if (last < first) bad_field(spec, f, text, "range '" + range + "' runs backwards");
      } else if (slash == std::string::npos) {
        last = first;
      }
    }
    for (int v = first; v <= last; v += step) bits |= uint64_t{1} << v;
  }
  return bits;
}

int days_in_month_max(int month) {  // February counts its leap day
  static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return kDays[month - 1];
}

std::string expand_macro(const std::string& spec) {
  static const std::pair<const char*, const char*> kMacros[] = {
      {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
      {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
      {"@hourly", "0 * * * *"}};
  for (const auto& [name, expr] : kMacros)
    if (spec == name) return expr;
  throw InputError("restart_at '" + spec +
                   "': unknown macro (expected @yearly, @annually, @monthly, @weekly, @daily, "
                   "@midnight or @hourly)");
}

}  // namespace

RestartSchedule RestartSchedule::parse(const std::string& spec) {
  RestartSchedule s;
  s.spec_ = spec;
  if (spec.empty()) return s;
  s.enabled_ = true;
  std::string expr = spec;
  if (spec[0] == '@') expr = expand_macro(spec);
  if (expr.find(' ') == std::string::npos) {
    // "HH:MM": every day at that local time.
    const auto colon = expr.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 3 != expr.size() || colon > 2 ||
        !is_digits(expr.substr(0, colon)) || !is_digits(expr.substr(colon + 1))) {
      throw InputError("restart_at '" + spec + "': expected HH:MM or 'M H DOM MON DOW'");
    }
    s.hours_ = parse_field(expr.substr(0, colon), kHour, spec);
    s.minutes_ = parse_field(expr.substr(colon + 1), kMinute, spec);
    s.days_.set();
    s.months_.set();
    s.weekdays_.set();
    return s;
  }
  std::stringstream ss(expr);
  std::vector<std::string> fields;
  std::string f;
  while (ss >> f) fields.push_back(f);
  if (fields.size() != 5)
    throw InputError("restart_at '" + spec + "': a cron expression has 5 fields (M H DOM MON DOW)");
  s.minutes_ = parse_field(fields[0], kMinute, spec);
  s.hours_ = parse_field(fields[1], kHour, spec);
  s.days_ = parse_field(fields[2], kDayOfMonth, spec);
  s.months_ = parse_field(fields[3], kMonth, spec);
  const uint64_t dow = parse_field(fields[4], kDayOfWeek, spec);
  s.weekdays_ = (dow | (dow >> 7)) & 0x7f;  // cron accepts both 0 and 7 for Sunday
  s.days_restricted_ = fields[2][0] != '*';
  s.weekdays_restricted_ = fields[4][0] != '*';
  // Every minute of an hour would restart every minute: surely a typo in a nightly schedule.
  if (s.minutes_.all())
    throw InputError("restart_at '" + spec + "': the minute field must name a minute, not all 60");
  // "0 3 31 2 *" is valid cron that never fires; say so rather than never restarting.
  if (s.days_restricted_ && !s.weekdays_restricted_) {
    bool possible = false;
    for (int m = 1; m <= 12 && !possible; ++m) {
      if (!s.months_.test(m)) continue;
      for (int d = 1; d <= days_in_month_max(m) && !possible; ++d) possible = s.days_.test(d);
    }
    if (!possible)
      throw InputError("restart_at '" + spec + "': no month of the expression has that day");
  }
  return s;
}

bool RestartSchedule::day_allowed(int mday, int month, int wday) const {
  if (!months_.test(month)) return false;
  const bool dom = days_.test(mday), dow = weekdays_.test(wday);
  if (days_restricted_ && weekdays_restricted_) return dom || dow;
  return dom && dow;
}

std::optional<int64_t> RestartSchedule::next_after(int64_t now_ms) const {
  if (!enabled_) return std::nullopt;
  // Walk local time: a day at a time over days that do not match, an hour at a time over hours
  // that do not, then minute by minute. Going through mktime for each candidate keeps
  // daylight-saving changes right (a skipped 02:30 simply never matches). Eight years of days
  // cover Feb 29 across a century year.
  std::time_t t = static_cast<std::time_t>(now_ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  tm.tm_sec = 0;
  tm.tm_min += 1;
  tm.tm_isdst = -1;
  const int64_t horizon_ms = now_ms + int64_t{8} * 366 * 24 * 3600 * 1000;
  // The iteration cap guards against a libc whose mktime steps back over a DST change.
  for (int i = 0; i < 10'000'000; ++i) {
    std::tm probe = tm;
    const std::time_t when = std::mktime(&probe);
    if (when == static_cast<std::time_t>(-1)) return std::nullopt;
    const int64_t ms = static_cast<int64_t>(when) * 1000;
    if (ms > horizon_ms) return std::nullopt;
    const bool day_ok = day_allowed(probe.tm_mday, probe.tm_mon + 1, probe.tm_wday);
    const bool hour_ok = day_ok && hours_.test(probe.tm_hour);
    if (hour_ok && minutes_.test(probe.tm_min) && ms > now_ms) return ms;
    tm = probe;
    tm.tm_isdst = -1;
    if (!day_ok) {
      tm.tm_mday += 1;
      tm.tm_hour = 0;
      tm.tm_min = 0;
    } else if (!hour_ok) {
      tm.tm_hour += 1;
      tm.tm_min = 0;
    } else {
      tm.tm_min += 1;
    }
  }
  return std::nullopt;
}

}  // namespace moebatch
