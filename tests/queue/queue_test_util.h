// Helpers shared by the queue tests: a temporary directory that is removed afterwards, and a
// store factory over a real SQLite file with a manual clock.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "queue/clock.h"
#include "queue/job_store.h"

namespace moebatch::test {

/// A fresh directory under the system temp dir, deleted with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("moebatch-queue-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The directory.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Options for a store on path driven by clock.
inline StoreOptions store_options(const std::filesystem::path& path,
                                  std::shared_ptr<const Clock> clock) {
  StoreOptions o;
  o.path = path;
  o.clock = std::move(clock);
  return o;
}

/// A minimal valid text job.
inline JobSpec text_job(std::string prompt, std::optional<std::string> key = std::nullopt) {
  JobSpec s;
  s.prompt = std::move(prompt);
  s.client_key = std::move(key);
  return s;
}

}  // namespace moebatch::test
