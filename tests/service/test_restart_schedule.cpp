// The restart schedule: "HH:MM" and 5-field cron (ranges, lists, steps, names, macros, the
// day-of-month / day-of-week OR rule), next times computed from a placed clock, DST.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>

#include "common/error.h"
#include "service/restart_schedule.h"

namespace moebatch {
namespace {

int64_t local_ms(int year, int mon, int day, int hour, int min, int sec = 0) {
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  tm.tm_isdst = -1;
  return static_cast<int64_t>(std::mktime(&tm)) * 1000;
}

int64_t next(const char* spec, int64_t now_ms) {
  const auto t = RestartSchedule::parse(spec).next_after(now_ms);
  EXPECT_TRUE(t.has_value()) << spec;
  return t.value_or(0);
}

// 2026-11-29 is a Sunday; 2026-12-04 a Friday.
TEST(RestartSchedule, DailyAndCronNextTimes) {
  const auto daily = RestartSchedule::parse("03:00");
  ASSERT_TRUE(daily.enabled());
  EXPECT_EQ(*daily.next_after(local_ms(2026, 11, 29, 2, 59, 58)), local_ms(2026, 11, 29, 3, 0));
  EXPECT_EQ(*daily.next_after(local_ms(2026, 11, 29, 3, 0)), local_ms(2026, 11, 30, 3, 0));
  EXPECT_EQ(next("30 2 * * 1", local_ms(2026, 11, 29, 12, 0)), local_ms(2026, 11, 30, 2, 30));
  EXPECT_EQ(next("0,30 4 * * *", local_ms(2026, 11, 29, 4, 10)), local_ms(2026, 11, 29, 4, 30));
  EXPECT_FALSE(RestartSchedule::parse("").enabled());
  EXPECT_FALSE(RestartSchedule::parse("").next_after(0));
}

TEST(RestartSchedule, RangesStepsAndNames) {
  const int64_t fri_4am = local_ms(2026, 12, 4, 4, 0);
  // Weekdays at 03:00: from Friday after 03:00 the next is Monday.
  EXPECT_EQ(next("0 3 * * 1-5", fri_4am), local_ms(2026, 12, 7, 3, 0));
  EXPECT_EQ(next("0 3 * * mon-fri", fri_4am), local_ms(2026, 12, 7, 3, 0));
  EXPECT_EQ(next("0 3 * * MON-Fri", fri_4am), local_ms(2026, 12, 7, 3, 0));
  EXPECT_EQ(next("0 3 * * 1-5", local_ms(2026, 12, 4, 2, 0)), local_ms(2026, 12, 4, 3, 0));
  // Weekends, with 7 and 0 both Sunday.
  EXPECT_EQ(next("0 0 * * 6-7", fri_4am), local_ms(2026, 12, 5, 0, 0));
  EXPECT_EQ(next("0 0 * * 7", local_ms(2026, 11, 30, 0, 0)), local_ms(2026, 12, 6, 0, 0));
  EXPECT_EQ(next("0 0 * * sun", local_ms(2026, 11, 30, 0, 0)), local_ms(2026, 12, 6, 0, 0));
  // Steps: */15, a stepped range, N/S (from N to the end).
  EXPECT_EQ(next("*/15 * * * *", local_ms(2026, 11, 29, 10, 7)), local_ms(2026, 11, 29, 10, 15));
  EXPECT_EQ(next("0-30/10 4 * * *", local_ms(2026, 11, 29, 4, 25)), local_ms(2026, 11, 29, 4, 30));
  EXPECT_EQ(next("0-30/10 4 * * *", local_ms(2026, 11, 29, 4, 31)), local_ms(2026, 11, 30, 4, 0));
  EXPECT_EQ(next("5/20 * * * *", local_ms(2026, 11, 29, 4, 26)), local_ms(2026, 11, 29, 4, 45));
  EXPECT_EQ(next("0 */6 * * *", local_ms(2026, 11, 29, 6, 0)), local_ms(2026, 11, 29, 12, 0));
  // Lists mixing ranges and single values; month names.
  EXPECT_EQ(next("0 0 1,15-16 * *", local_ms(2026, 12, 1, 0, 0)), local_ms(2026, 12, 15, 0, 0));
  EXPECT_EQ(next("0 12 * jan,jul *", local_ms(2026, 11, 29, 0, 0)), local_ms(2027, 1, 1, 12, 0));
  EXPECT_EQ(next("0 12 1 apr-jun *", local_ms(2026, 11, 29, 0, 0)), local_ms(2027, 4, 1, 12, 0));
  // Feb 29 is found across years.
  EXPECT_EQ(next("0 0 29 2 *", local_ms(2026, 3, 1, 0, 0)), local_ms(2028, 2, 29, 0, 0));
}

TEST(RestartSchedule, BothDayFieldsRestrictedMeansEither) {
  // cron(5): "13th or a Friday": Friday 2026-12-04 comes before Sunday 2026-12-13.
  EXPECT_EQ(next("0 0 13 * fri", local_ms(2026, 11, 29, 12, 0)), local_ms(2026, 12, 4, 0, 0));
  EXPECT_EQ(next("0 0 13 * fri", local_ms(2026, 12, 11, 12, 0)), local_ms(2026, 12, 13, 0, 0));
  // A day field starting with '*' does not restrict, so "*/2" and Friday must both hold: the
  // first odd-numbered Friday after Nov 29 is Dec 11.
  EXPECT_EQ(next("0 0 */2 * fri", local_ms(2026, 11, 29, 12, 0)), local_ms(2026, 12, 11, 0, 0));
}

TEST(RestartSchedule, Macros) {
  EXPECT_EQ(next("@daily", local_ms(2026, 11, 29, 12, 0)), local_ms(2026, 11, 30, 0, 0));
  EXPECT_EQ(next("@midnight", local_ms(2026, 11, 29, 12, 0)), local_ms(2026, 11, 30, 0, 0));
  EXPECT_EQ(next("@weekly", local_ms(2026, 11, 30, 12, 0)), local_ms(2026, 12, 6, 0, 0));
  EXPECT_EQ(next("@monthly", local_ms(2026, 11, 29, 12, 0)), local_ms(2026, 12, 1, 0, 0));
  EXPECT_EQ(next("@yearly", local_ms(2026, 11, 29, 12, 0)), local_ms(2027, 1, 1, 0, 0));
  EXPECT_EQ(next("@hourly", local_ms(2026, 11, 29, 12, 1)), local_ms(2026, 11, 29, 13, 0));
}

TEST(RestartSchedule, BadExpressionsNameTheField) {
  for (const char* bad : {"3:00pm",     "25:00",       "03:60",           ":30",
                          "3:0",        "* * * * *",   "0-59 3 * * *",    "*/1 * * * *",
                          "0 3 * *",    "0 3 * * * *", "x 3 * * *",       "60 3 * * *",
                          "0 24 * * *", "0 3 32 * *",  "0 3 0 * *",       "0 3 * 13 *",
                          "0 3 * * 8",  "0 3 * * 5-1", "*/0 3 * * *",     "0 3 * * 1-5/",
                          "0 3 ,1 * *", "0 3 1, * *",  "0 3 * foo *",     "0 3 * * monday",
                          "0 3 -5 * *", "0 3 31 2 *",  "0 3 30,31 feb *", "@reboot",
                          "@nightly"}) {
    EXPECT_THROW(RestartSchedule::parse(bad), InputError) << bad;
  }
  try {
    RestartSchedule::parse("0 3 * * 9");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("day-of-week field '9'"), std::string::npos) << e.what();
  }
  try {
    RestartSchedule::parse("0 3 31 2 *");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no month"), std::string::npos) << e.what();
  }
  // The 31st in some month, or any Sunday in February, can fire.
  EXPECT_NO_THROW(RestartSchedule::parse("0 3 31 1-2 *"));
  EXPECT_NO_THROW(RestartSchedule::parse("0 3 31 2 sun"));
}

// Runs the body with TZ set, restoring the previous value.
class ScopedTz {
 public:
  explicit ScopedTz(const char* tz) {
    if (const char* old = std::getenv("TZ")) old_ = old;
    setenv("TZ", tz, 1);
    tzset();
  }
  ~ScopedTz() {
    if (old_)
      setenv("TZ", old_->c_str(), 1);
    else
      unsetenv("TZ");
    tzset();
  }
  ScopedTz(const ScopedTz&) = delete;
  ScopedTz& operator=(const ScopedTz&) = delete;

 private:
  std::optional<std::string> old_;
};

TEST(RestartSchedule, DaylightSavingGapIsSkipped) {
  if (!std::filesystem::exists("/usr/share/zoneinfo/Europe/Berlin"))
    GTEST_SKIP() << "no tzdata (/usr/share/zoneinfo/Europe/Berlin)";
  ScopedTz tz("Europe/Berlin");
  // 2026-03-29 02:00 CET jumps to 03:00 CEST: 02:30 does not exist that day.
  EXPECT_EQ(next("30 2 * * *", local_ms(2026, 3, 29, 0, 0)), local_ms(2026, 3, 30, 2, 30));
  EXPECT_EQ(next("30 3 * * *", local_ms(2026, 3, 29, 0, 0)), local_ms(2026, 3, 29, 3, 30));
  // Across the autumn change (2026-10-25 03:00 CEST becomes 02:00 CET) the 25th's 03:00 is 25
  // hours after the 24th's.
  const int64_t a = next("0 3 * * *", local_ms(2026, 10, 23, 12, 0));
  EXPECT_EQ(next("0 3 * * *", a) - a, int64_t{25} * 3600 * 1000);
}

}  // namespace
}  // namespace moebatch
