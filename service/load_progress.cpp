#include "service/load_progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/log.h"
#include "service/process_stats.h"

namespace moebatch {
namespace {

constexpr auto kSampleEvery = std::chrono::milliseconds(250);
constexpr double kLogEverySeconds = 10;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int64_t model_file_bytes(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (model.rfind("random:", 0) == 0) return 0;
  if (fs::is_regular_file(model, ec)) return static_cast<int64_t>(fs::file_size(model, ec));
  int64_t total = 0;
  for (auto it = fs::directory_iterator(model, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const auto ext = it->path().extension();
    if (ext != ".safetensors" && ext != ".gguf") continue;
    const auto size = it->file_size(ec);
    if (!ec) total += static_cast<int64_t>(size);
    ec.clear();
  }
  return total;
}

std::string format_gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

std::string load_progress_line(int64_t done_bytes, int64_t total_bytes, double seconds) {
  const int64_t done = std::clamp<int64_t>(done_bytes, 0, total_bytes);
  const double pct = total_bytes > 0 ? 100.0 * static_cast<double>(done) / total_bytes : 0.0;
  const double rate = seconds > 0 ? static_cast<double>(done) / 1e9 / seconds : 0.0;
  return fmt::format("loading model: {:.2f} / {} ({:.0f}%), {:.2f} GB/s",
                     static_cast<double>(done) / 1e9, format_gb(static_cast<double>(total_bytes)),
                     pct, rate);
}

LoadProgress::LoadProgress(const std::string& model)
    : total_(model_file_bytes(model)),
      baseline_(process_file_rss_bytes()),
      terminal_(isatty(STDERR_FILENO) != 0 && !log_format_json()),
      start_(std::chrono::steady_clock::now()) {
  if (total_ > 0) {
    spdlog::info("loading model {} ({})", model, format_gb(static_cast<double>(total_)));
    thread_ = std::thread([this] { run(); });
  }
}

LoadProgress::~LoadProgress() { stop(); }

void LoadProgress::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (drew_) {
    std::fputs("\r\033[K", stderr);  // clear the progress line before the next log line
    drew_ = false;
  }
}

void LoadProgress::run() {
  double next_log = kLogEverySeconds;
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, kSampleEvery, [this] { return stopping_; })) {
    const int64_t read = process_file_rss_bytes() - baseline_;
    const double s = seconds_since(start_);
    if (terminal_) {
      std::fprintf(stderr, "\r\033[K%s", load_progress_line(read, total_, s).c_str());
      std::fflush(stderr);
      drew_ = true;
    } else if (s >= next_log) {
      spdlog::info("{}", load_progress_line(read, total_, s));
      next_log += kLogEverySeconds;
    }
  }
}

double LoadProgress::done() {
  stop();
  const double s = seconds_since(start_);
  if (total_ > 0) {
    spdlog::info("engine built: {} of weights read, built and warmed up in {:.2f} s ({:.2f} GB/s)",
                 format_gb(static_cast<double>(total_)), s,
                 s > 0 ? static_cast<double>(total_) / 1e9 / s : 0.0);
  }
  return s;
}

}  // namespace moebatch
