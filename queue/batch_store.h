// Records of the OpenAI Files and Batch API (migration 4 of schemas/jobs.sql): uploaded files,
// batches and the output/error files they write, in the job database beside the jobs a batch
// becomes (jobs.batch_id = batches.id). A batch's state only moves forward:
//
//   validating ──▶ in_progress ──▶ completed           (output written when every job is final)
//        │              └──cancel──▶ cancelling ──▶ cancelled
//        └──▶ failed  (the input file has bad lines; no job was queued)
//
// Every transition is a conditional UPDATE on the expected current status, so a daemon that
// restarts half-way redoes only the step it had not committed (validation re-submits with the
// same idempotency keys; finalizing writes the files and the new status in one transaction).
//
// The SQL of each database (SQLite, PostgreSQL) lives behind BatchStoreBackend
// (queue/batch_store_backend.h).
//
// Thread-safety: one BatchStore = one database connection = one thread, like JobStore. On SQLite
// open it after a JobStore has brought the file to the current schema; on PostgreSQL it
// migrates the database itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moebatch {

class BatchStoreBackend;

/// A file's content is stored in pieces of at most this many bytes (file_chunks, migration 10),
/// cut at UTF-8 character boundaries, so a download reads and sends one piece at a time. Files
/// written before migration 10 were moved into one piece each; the BatchStore constructor cuts
/// those past this size (once: reading each whole that one time).
inline constexpr size_t kFileChunkBytes = size_t{1} << 20;

/// A stored file's metadata.
struct StoredFile {
  std::string id;          ///< "file-<hex>"
  std::string purpose;     ///< "batch" | "batch_output"
  std::string filename;    ///< as uploaded, or "<batch>_output.jsonl"
  int64_t bytes = 0;       ///< content size
  int64_t created_at = 0;  ///< seconds since the epoch
};

/// One batch row.
struct BatchRecord {
  std::string id;                       ///< "batch_<hex>"
  std::string input_file_id;            ///< the uploaded requests
  std::string endpoint;                 ///< "/v1/chat/completions" | "/v1/completions"
  std::string completion_window;        ///< "24h"
  std::optional<std::string> metadata;  ///< JSON object
  std::string status = "validating";    ///< see the file comment
  int64_t total = 0;                    ///< requests queued
  std::optional<std::string> errors;    ///< JSON array of {code, message, line}
  std::optional<std::string> output_file_id, error_file_id;
  int64_t created_at = 0;  ///< seconds since the epoch, as every time below
  std::optional<int64_t> in_progress_at, finalizing_at, completed_at, failed_at, cancelling_at,
      cancelled_at, expires_at;
};

/// The files and batches tables over one connection; see the file comment.
class BatchStore {
 public:
  /// Opens the database at `location`, a SQLite file (WAL, busy timeout 5 s; Error when the
  /// tables are missing) or a postgresql:// URL (lock timeout 5 s).
  explicit BatchStore(const std::string& location);
  ~BatchStore();
  BatchStore(const BatchStore&) = delete;
  BatchStore& operator=(const BatchStore&) = delete;

  /// Stores a file under a fresh id.
  StoredFile add_file(const std::string& purpose, const std::string& filename,
                      const std::string& content, int64_t now_s);
  /// A file's metadata, if it exists.
  std::optional<StoredFile> file(const std::string& id);
  /// A file's content whole, if it exists (a batch's input file, bounded by the upload limit;
  /// downloads go piece by piece through file_chunk).
  std::optional<std::string> file_content(const std::string& id);
  /// Piece `seq` (0, 1, ...) of a file's content; nullopt past the last piece or when the file
  /// does not exist (or was deleted meanwhile). The pieces in order are the content.
  std::optional<std::string> file_chunk(const std::string& id, int64_t seq);
  /// Files newest first, optionally of one purpose; `after` = the last id of the previous page.
  std::vector<StoredFile> list_files(const std::optional<std::string>& after, int64_t limit,
                                     const std::optional<std::string>& purpose, bool& has_more);
  /// Deletes a file; false when there is none.
  bool delete_file(const std::string& id);

  /// Inserts a batch (status validating) under a fresh id, which it returns in the record.
  BatchRecord add_batch(BatchRecord b);
  /// A batch, if it exists.
  std::optional<BatchRecord> batch(const std::string& id);
  /// Newest first; `after` = the last id of the previous page. `has_more` tells whether more.
  std::vector<BatchRecord> list_batches(const std::optional<std::string>& after, int64_t limit,
                                        bool& has_more);
  /// Batches in one of these statuses, oldest first.
  std::vector<BatchRecord> batches_with_status(const std::vector<std::string>& statuses);

  /// Moves a batch from `from` to `to` (setting `<to>_at = now_s`) when it is in `from`; also
  /// sets `total` and `errors` when given. False when it was not in `from`.
  bool transition(const std::string& id, const std::string& from, const std::string& to,
                  int64_t now_s, std::optional<int64_t> total = std::nullopt,
                  const std::optional<std::string>& errors = std::nullopt);
  /// Ends a batch: stores the output and error files (when non-empty) and moves it from `from`
  /// to `to` with finalizing_at and `<to>_at`, all in one transaction. False (nothing written)
  /// when it was not in `from`.
  bool finish(const std::string& id, const std::string& from, const std::string& to,
              const std::string& output, const std::string& errors, int64_t now_s);

 private:
  std::unique_ptr<BatchStoreBackend> impl_;
};

}  // namespace moebatch
