// Helpers shared by the queue, ZeroMQ and service tests: options for a store over a real SQLite
// file (with a manual clock where a test moves time), and a minimal job.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "queue/clock.h"
#include "queue/job_store.h"

namespace moebatch::test {

/// Options for a store on path driven by clock (the system clock unless given).
inline StoreOptions store_options(const std::filesystem::path& path,
                                  std::shared_ptr<const Clock> clock = nullptr) {
  StoreOptions o;
  o.path = path;
  if (clock) o.clock = std::move(clock);
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
