#include "service/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace moebatch {
namespace {

// "btime N" from /proc/stat: boot time, seconds since the epoch.
int64_t boot_time_seconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("btime ", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::istringstream ss(line.substr(prefix.size()));
    int64_t kb = 0;
    ss >> kb;
    return kb;
  }
  return 0;
}

}  // namespace

std::optional<ProcessStats> read_process_stats() {
  std::ifstream in("/proc/self/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  // The command name (field 2) is in parentheses and may hold spaces: fields count from the
  // last ')'. After it: state (3), ..., utime (14), stime (15), starttime (22), vsize (23),
  // rss (24).
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream ss(text.substr(close + 1));
  std::vector<std::string> f;
  for (std::string x; ss >> x;) f.push_back(x);
  if (f.size() < 22) return std::nullopt;
  auto field = [&](int n) { return std::stod(f[static_cast<size_t>(n - 3)]); };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  ProcessStats s;
  s.cpu_seconds = (field(14) + field(15)) / ticks;
  s.start_time_seconds = static_cast<double>(boot_time_seconds()) + field(22) / ticks;
  s.virtual_bytes = static_cast<int64_t>(field(23));
  s.resident_bytes = static_cast<int64_t>(field(24) * page);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++s.open_fds;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    s.max_fds = static_cast<int64_t>(rl.rlim_cur);
  return s;
}

int64_t process_file_rss_bytes() { return status_kb("RssFile") * 1024; }

}  // namespace moebatch
