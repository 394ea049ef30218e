// Model-load progress while the engine is built: bytes of the checkpoint read so far and the
// rate. Checkpoints are mmap()ed by the loaders, so the pages they have touched are the
// process's file-backed resident memory (RssFile) above what it was before the load; a
// sampling thread follows it. On a terminal (stderr, text logs) it redraws one line; otherwise
// it logs a line every 10 s of a long load. done() logs the total and the rate. The bytes are
// an estimate (other file mappings count too, and a loader may drop pages it has copied); the
// final rate is the checkpoint's size over the whole build.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace moebatch {

/// Bytes of a model's weight files: the *.safetensors and *.gguf files of a directory, or the
/// file itself; 0 for a "random:" model or a path that is not there.
int64_t model_file_bytes(const std::string& model);

/// "1.25 GB" (decimal units, as disk and network rates are quoted).
std::string format_gb(double bytes);

/// One progress line: "loading model: 1.25 / 4.00 GB (31%), 2.10 GB/s".
std::string load_progress_line(int64_t done_bytes, int64_t total_bytes, double seconds);

/// Follows one model load from construction to done(); see the file comment.
class LoadProgress {
 public:
  /// Starts following the load of `model` (nothing to follow for a model without files).
  explicit LoadProgress(const std::string& model);
  ~LoadProgress();
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

  /// Stops following and logs the size, the seconds since construction and the rate. Returns
  /// the seconds.
  double done();

 private:
  void run();
  void stop();

  int64_t total_ = 0;
  int64_t baseline_ = 0;
  bool terminal_ = false;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool drew_ = false;  // a terminal line is showing
  std::thread thread_;
};

}  // namespace moebatch
