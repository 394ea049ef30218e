// BatchStore on PostgreSQL: the files and batches tables of migration 1 (schemas/jobs_pg.sql),
// shared by every host. Lists page by the identity column seq (insertion order). Status moves
// are conditional UPDATEs, and finish() locks the batch row before it writes the output files,
// so of two hosts finishing one batch only the first writes them.
#include "common/error.h"
#include "queue/batch_store_backend.h"
#include "queue/pg_conn.h"
#include "queue/pg_job_store.h"
#include "queue/store_url.h"

namespace moebatch {
namespace {

BatchRecord read_batch(const PgResult& r, int i) {
  BatchRecord b;
  b.id = r.text(i, 0);
  b.input_file_id = r.text(i, 1);
  b.endpoint = r.text(i, 2);
  b.completion_window = r.text(i, 3);
  b.metadata = r.opt_text(i, 4);
  b.status = r.text(i, 5);
  b.total = r.i64(i, 6);
  b.errors = r.opt_text(i, 7);
  b.output_file_id = r.opt_text(i, 8);
  b.error_file_id = r.opt_text(i, 9);
  b.created_at = r.i64(i, 10);
  b.in_progress_at = r.opt_i64(i, 11);
  b.finalizing_at = r.opt_i64(i, 12);
  b.completed_at = r.opt_i64(i, 13);
  b.failed_at = r.opt_i64(i, 14);
  b.cancelling_at = r.opt_i64(i, 15);
  b.cancelled_at = r.opt_i64(i, 16);
  b.expires_at = r.opt_i64(i, 17);
  return b;
}

std::vector<BatchRecord> read_batches(const PgResult& r) {
  std::vector<BatchRecord> out;
  for (int i = 0; i < r.rows(); ++i) out.push_back(read_batch(r, i));
  return out;
}

std::vector<StoredFile> read_files(const PgResult& r) {
  std::vector<StoredFile> out;
  for (int i = 0; i < r.rows(); ++i)
    out.push_back({r.text(i, 0), r.text(i, 1), r.text(i, 2), r.i64(i, 3), r.i64(i, 4)});
  return out;
}

// A file's pieces as file_chunks rows 0, 1, ... (inside the caller's transaction).
void insert_pieces(PgConn& c, const std::string& id, const std::vector<std::string_view>& pieces) {
  int64_t seq = 0;
  for (std::string_view piece : pieces)
    c.exec("INSERT INTO file_chunks (file_id, seq, data) VALUES ($1, $2, $3)",
           PgParams().add(id).add(seq++).add(piece));
}

// The file's row and its content's pieces (inside the caller's transaction).
void insert_file(PgConn& c, const StoredFile& f, std::string_view content) {
  c.exec(
      "INSERT INTO files (id, purpose, filename, bytes, created_at) VALUES ($1, $2, $3, $4, $5)",
      PgParams().add(f.id).add(f.purpose).add(f.filename).add(f.bytes).add(f.created_at));
  insert_pieces(c, f.id, split_file_content(content));
}

class PgBatchStore final : public BatchStoreBackend {
 public:
  explicit PgBatchStore(const std::string& url) : conn_(std::make_unique<PgConn>(url)) {
    // As SQLite's 5 s busy timeout: a write waits that long for another session's lock.
    conn_->set_session_setup("SET lock_timeout = 5000");
    conn_->exec("SET lock_timeout = 5000");
    migrate_pg_schema(*conn_, store_location_for_display(url));
  }

  void add_file(const StoredFile& f, const std::string& content) override {
    // An upload PostgreSQL text cannot hold is refused (SQLite stores it); a batch input file
    // has to be UTF-8 JSON lines anyway.
    if (auto p = pg_text_problem(f.filename)) throw InputError("file: filename " + *p);
    if (auto p = pg_text_problem(content)) throw InputError("file: content " + *p);
    PgTransaction tx(*conn_);
    insert_file(*conn_, f, content);
    tx.commit();
  }

  std::optional<StoredFile> file(const std::string& id) override {
    auto files = read_files(
        conn_->exec("SELECT id, purpose, filename, bytes, created_at FROM files WHERE id = $1",
                    PgParams().add(id)));
    if (files.empty()) return std::nullopt;
    return files.front();
  }

  std::optional<std::string> file_content(const std::string& id) override {
    // One statement, one snapshot: the row and its pieces as of the same moment.
    PgResult r = conn_->exec(
        "SELECT c.data FROM files f LEFT JOIN file_chunks c ON c.file_id = f.id WHERE f.id = $1 "
        "ORDER BY c.seq",
        PgParams().add(id));
    if (r.rows() == 0) return std::nullopt;
    std::string content;
    for (int i = 0; i < r.rows(); ++i)
      if (!r.is_null(i, 0)) content += r.text(i, 0);
    return content;
  }

  std::vector<std::string> files_in_one_large_piece(int64_t max_bytes) override {
    PgResult r = conn_->exec(
        "SELECT f.id FROM files f WHERE f.bytes > $1 AND NOT EXISTS "
        "(SELECT 1 FROM file_chunks c WHERE c.file_id = f.id AND c.seq = 1)",
        PgParams().add(max_bytes));
    std::vector<std::string> ids;
    for (int i = 0; i < r.rows(); ++i) ids.push_back(r.text(i, 0));
    return ids;
  }

  bool recut_file(const std::string& id, const std::vector<std::string_view>& pieces) override {
    PgTransaction tx(*conn_);
    // The file's row locked first, so that a second opener waits and then counts this one's
    // pieces (its own count would otherwise come from before this commit).
    if (conn_->exec("SELECT id FROM files WHERE id = $1 FOR UPDATE", PgParams().add(id)).rows() == 0)
      return false;
    if (conn_->exec("SELECT count(*) FROM file_chunks WHERE file_id = $1", PgParams().add(id)).i64(0, 0) != 1)
      return false;
    conn_->exec("DELETE FROM file_chunks WHERE file_id = $1", PgParams().add(id));
    insert_pieces(*conn_, id, pieces);
    tx.commit();
    return true;
  }

  std::optional<std::string> file_chunk(const std::string& id, int64_t seq) override {
    PgResult r = conn_->exec("SELECT data FROM file_chunks WHERE file_id = $1 AND seq = $2",
                             PgParams().add(id).add(seq));
    if (r.rows() == 0) return std::nullopt;
    return r.text(0, 0);
  }

  std::vector<StoredFile> list_files(const std::optional<std::string>& after, int64_t limit,
                                     const std::optional<std::string>& purpose) override {
    return read_files(conn_->exec(
        "SELECT id, purpose, filename, bytes, created_at FROM files WHERE ($1::text IS NULL OR "
        "seq < (SELECT seq FROM files WHERE id = $1)) AND ($2::text IS NULL OR purpose = $2) "
        "ORDER BY seq DESC LIMIT $3",
        PgParams().add(after).add(purpose).add(limit)));
  }

  bool delete_file(const std::string& id) override {
    PgTransaction tx(*conn_);
    const bool gone =
        conn_->exec("DELETE FROM files WHERE id = $1", PgParams().add(id)).affected() > 0;
    conn_->exec("DELETE FROM file_chunks WHERE file_id = $1", PgParams().add(id));
    tx.commit();
    return gone;
  }

  void add_batch(const BatchRecord& b) override {
    conn_->exec(
        "INSERT INTO batches (id, input_file_id, endpoint, completion_window, metadata, status, "
        "created_at, expires_at) VALUES ($1, $2, $3, $4, $5, 'validating', $6, $7)",
        PgParams()
            .add(b.id)
            .add(b.input_file_id)
            .add(b.endpoint)
            .add(b.completion_window)
            .add(b.metadata)
            .add(b.created_at)
            .add(b.expires_at));
  }

  std::optional<BatchRecord> batch(const std::string& id) override {
    auto rows = read_batches(
        conn_->exec(std::string("SELECT ") + kBatchColumns + " FROM batches WHERE id = $1",
                    PgParams().add(id)));
    if (rows.empty()) return std::nullopt;
    return rows.front();
  }

  std::vector<BatchRecord> list_batches(const std::optional<std::string>& after,
                                        int64_t limit) override {
    return read_batches(conn_->exec(std::string("SELECT ") + kBatchColumns +
                                        " FROM batches WHERE $1::text IS NULL OR seq < "
                                        "(SELECT seq FROM batches WHERE id = $1) "
                                        "ORDER BY seq DESC LIMIT $2",
                                    PgParams().add(after).add(limit)));
  }

  std::vector<BatchRecord> batches_with_status(const std::string& status) override {
    return read_batches(conn_->exec(
        std::string("SELECT ") + kBatchColumns + " FROM batches WHERE status = $1 ORDER BY seq",
        PgParams().add(status)));
  }

  bool transition(const std::string& id, const std::string& from, const std::string& to,
                  const std::string& at_column, int64_t now_s, std::optional<int64_t> total,
                  const std::optional<std::string>& errors) override {
    return conn_
               ->exec("UPDATE batches SET status = $3, " + at_column +
                          " = $4, total = coalesce($5, total), errors = coalesce($6, errors) "
                          "WHERE id = $1 AND status = $2",
                      PgParams().add(id).add(from).add(to).add(now_s).add(total).add(
                          errors ? std::optional(pg_text(*errors)) : std::nullopt))
               .affected() > 0;
  }

  bool finish(const std::string& id, const std::string& from, const std::string& to,
              const std::string& at_column, const std::vector<StoredFile>& files,
              const std::vector<std::string_view>& contents,
              const std::optional<std::string>& output_id,
              const std::optional<std::string>& error_id, int64_t now_s) override {
    PgTransaction tx(*conn_);
    // The row lock makes a second finisher wait here and then see the new status.
    PgResult r =
        conn_->exec("SELECT status FROM batches WHERE id = $1 FOR UPDATE", PgParams().add(id));
    if (r.rows() == 0 || r.text(0, 0) != from) return false;
    for (size_t i = 0; i < files.size(); ++i) insert_file(*conn_, files[i], contents[i]);
    conn_->exec("UPDATE batches SET status = $2, finalizing_at = $3, " + at_column +
                    " = $3, output_file_id = $4, error_file_id = $5 WHERE id = $1",
                PgParams().add(id).add(to).add(now_s).add(output_id).add(error_id));
    tx.commit();
    return true;
  }

 private:
  std::unique_ptr<PgConn> conn_;
};

}  // namespace

std::unique_ptr<BatchStoreBackend> make_pg_batch_store(const std::string& url) {
  return std::make_unique<PgBatchStore>(url);
}

}  // namespace moebatch
