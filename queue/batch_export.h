// A batch's results as OpenAI's two Batch files, read page by page: `moebatch export` reads the
// pages from the database, or from an ingress (the batch_results command, docs/zmq.md), which
// serves the same pages to remote producers. One page function for both, so a file exported
// over ZeroMQ is byte for byte the file exported on the database host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moebatch {

class JobStore;

/// One final job's line (batch_output_line): done jobs go to the output file, failed and
/// cancelled ones to the error file.
struct BatchExportLine {
  bool done = false;
  nlohmann::json line;
};

/// One page: the batch's jobs in id order after some id.
struct BatchExportPage {
  std::vector<BatchExportLine> lines;  ///< the final jobs, in id order
  int64_t unfinished = 0;              ///< queued or running jobs of the page (skipped)
  std::optional<int64_t> last_id;      ///< the page's last job: the next page starts after it
  bool more = false;                   ///< the batch may hold jobs after last_id
};

/// Reads up to `limit` jobs of batch_id after after_id, a few rows at a time (a row holds its
/// prompt, up to a MiB). Stops early, with `more` set, once the lines pass max_bytes
/// (serialized), keeping at least one job so that every page advances.
BatchExportPage batch_export_page(JobStore& store, const std::string& batch_id, int64_t after_id,
                                  int64_t limit, size_t max_bytes);

/// A finished batch's two files as OpenAI Batch JSONL: output lines of its done jobs, error
/// lines of its failed and cancelled ones, in id order.
struct BatchFiles {
  std::string output, errors;
};

/// Builds them page by page (batch_export_page). Refused with InputError once the two together
/// pass max_bytes (checked after each page, so memory stays within max_bytes plus a page): such a
/// batch's results stay in the job table, where `moebatch export` writes files of any size.
BatchFiles batch_files(JobStore& store, const std::string& batch_id, size_t max_bytes);

/// The page as a reply member, and back; from_json throws Error on a malformed object.
nlohmann::json batch_export_page_to_json(const BatchExportPage& page);
BatchExportPage batch_export_page_from_json(const nlohmann::json& j);

}  // namespace moebatch
