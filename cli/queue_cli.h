// What the queue commands (cmd_queue.cpp, cmd_batch.cpp) share: the flags every one takes,
// opening the store, integer flags, output that producer-chosen text cannot abuse, times and
// the progress bar. One definition each, so `submit`, `list` and `batch` agree.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "queue/job_store.h"
#include "queue/zmq/client.h"

namespace moebatch::cli {

/// Flags every queue command shares.
struct CommonFlags {
  std::string db;     ///< --db: SQLite file or postgresql:// URL
  bool json = false;  ///< --json: machine-readable output
};

/// Adds --db and --json.
void add_common(CLI::App* cmd, CommonFlags& f);

/// Adds --endpoint, --timeout-ms, --attempts, --curve-server-key and --curve-secret.
void add_remote(CLI::App* cmd, zmq_ingress::RemoteSubmitFlags& f);

/// Opens --db: a SQLite file (its directory is created) or a postgresql:// URL; any other scheme
/// is a usage error.
std::unique_ptr<JobStore> open_store(const CommonFlags& f);

/// Job fields come from producers: a key or an error text holding ESC [ ... could rewrite the
/// operator's terminal. Shows C0/C1 controls, DEL and bytes that are not UTF-8 as \xNN (C1 as
/// \u00NN) instead; everything else passes unchanged.
std::string printable(std::string_view s);

/// A CLI11 check that an integer flag is plain decimal int64 (CLI11 alone reads "010" as octal
/// and clamps "99999999999999999999"); failing it is a usage error (exit 2).
CLI::Validator decimal_int();

/// "2026-11-30 12:00:00.000Z", or "-" for none.
std::string format_time(std::optional<int64_t> ms);

/// Whether a progress bar may be drawn: stderr is a terminal and --no-progress was not given.
bool progress_wanted(bool no_progress);

/// A one-line progress bar on stderr, drawn only when enabled (progress_wanted).
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled) : label_(std::move(label)), on_(enabled) {}
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  /// Redraws "label [####....] done/total suffix".
  void update(size_t done, size_t total, const std::string& suffix = "");
  /// Whether it draws at all.
  bool on() const { return on_; }

 private:
  std::string label_;
  bool on_;
  bool drawn_ = false;
};

}  // namespace moebatch::cli
