// The seam between BatchStore and the database under it (internal to the queue module), as
// JobStoreBackend is for JobStore. BatchStore picks ids and checks arguments; a backend runs
// one database's SQL with the same contract:
//   - SQLite (sqlite_batch_store.cpp): migration 4 of schemas/jobs.sql; lists page by rowid.
//   - PostgreSQL (pg_batch_store.cpp): migration 1 of schemas/jobs_pg.sql; lists page by the
//     identity column seq, which is in insertion order as rowid is there.
// Every status change is one UPDATE conditioned on the current status, so of two hosts moving
// one batch at most one succeeds on either database.
//
// Thread-safety: one backend = one connection = one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "queue/batch_store.h"

namespace moebatch {

/// One database's implementation of BatchStore; see BatchStore for each method's contract.
/// `at_column` arguments are already checked column names ("completed_at", ...).
class BatchStoreBackend {
 public:
  virtual ~BatchStoreBackend() = default;
  virtual void add_file(const StoredFile& f, const std::string& content) = 0;
  virtual std::optional<StoredFile> file(const std::string& id) = 0;
  virtual std::optional<std::string> file_content(const std::string& id) = 0;
  virtual std::optional<std::string> file_chunk(const std::string& id, int64_t seq) = 0;
  /// Up to `limit` files, newest first.
  virtual std::vector<StoredFile> list_files(const std::optional<std::string>& after, int64_t limit,
                                             const std::optional<std::string>& purpose) = 0;
  virtual bool delete_file(const std::string& id) = 0;
  /// Files of more than `max_bytes` held in one piece: stored before migration 10, which moved
  /// each file's content into its piece 0 as it was.
  virtual std::vector<std::string> files_in_one_large_piece(int64_t max_bytes) = 0;
  /// Replaces such a file's one piece by `pieces` (its content cut), in one transaction that
  /// first makes sure it is still one piece; false when it is not (another opener cut it, or
  /// the file is gone).
  virtual bool recut_file(const std::string& id, const std::vector<std::string_view>& pieces) = 0;
  virtual void add_batch(const BatchRecord& b) = 0;
  virtual std::optional<BatchRecord> batch(const std::string& id) = 0;
  /// Up to `limit` batches, newest first.
  virtual std::vector<BatchRecord> list_batches(const std::optional<std::string>& after,
                                                int64_t limit) = 0;
  virtual std::vector<BatchRecord> batches_with_status(const std::string& status) = 0;
  virtual bool transition(const std::string& id, const std::string& from, const std::string& to,
                          const std::string& at_column, int64_t now_s, std::optional<int64_t> total,
                          const std::optional<std::string>& errors) = 0;
  /// Stores `files` (already named) and moves the batch, in one transaction; false (nothing
  /// written) when it was not in `from`.
  virtual bool finish(const std::string& id, const std::string& from, const std::string& to,
                      const std::string& at_column, const std::vector<StoredFile>& files,
                      const std::vector<std::string_view>& contents,
                      const std::optional<std::string>& output_id,
                      const std::optional<std::string>& error_id, int64_t now_s) = 0;
};

/// The batches table's columns in the order both backends read a BatchRecord from a row (the
/// two schemas name them alike).
inline constexpr const char* kBatchColumns =
    "id, input_file_id, endpoint, completion_window, metadata, status, total, errors, "
    "output_file_id, error_file_id, created_at, in_progress_at, finalizing_at, completed_at, "
    "failed_at, cancelling_at, cancelled_at, expires_at";

/// `content` cut into the pieces file_chunks stores: each at most `max_bytes` (≥ 4), ending
/// before a byte that continues a UTF-8 character (PostgreSQL text must hold each piece alone).
/// Content that is not UTF-8 (more than three continuation bytes in a row) is cut where it falls.
std::vector<std::string_view> split_file_content(std::string_view content,
                                                 size_t max_bytes = kFileChunkBytes);

/// The SQLite implementation over the file at `path`.
std::unique_ptr<BatchStoreBackend> make_sqlite_batch_store(const std::string& path);
/// The PostgreSQL implementation over the database at `url`.
std::unique_ptr<BatchStoreBackend> make_pg_batch_store(const std::string& url);

}  // namespace moebatch
