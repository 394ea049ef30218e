// This process's resource use, read from /proc (Linux): what Prometheus client libraries export
// as the standard process_* metrics, and the file-backed resident memory that the model-load
// progress follows (checkpoints are mmap()ed, so their pages count there as they are read).
#pragma once

#include <cstdint>
#include <optional>

namespace moebatch {

/// One reading of /proc/self; fields are 0 where /proc does not say.
struct ProcessStats {
  double cpu_seconds = 0;         ///< user + system CPU time
  int64_t resident_bytes = 0;     ///< resident set size
  int64_t virtual_bytes = 0;      ///< virtual memory size
  int64_t open_fds = 0;           ///< entries of /proc/self/fd
  int64_t max_fds = 0;            ///< soft RLIMIT_NOFILE
  double start_time_seconds = 0;  ///< process start, seconds since the Unix epoch
};

/// Reads /proc/self/stat, /proc/self/fd and /proc/stat (boot time); nullopt without /proc.
std::optional<ProcessStats> read_process_stats();

/// File-backed resident memory of this process (RssFile in /proc/self/status), bytes; 0 when
/// unknown.
int64_t process_file_rss_bytes();

}  // namespace moebatch
