// BatchStore on SQLite: the files and batches tables of migration 4 (schemas/jobs.sql).
#include "common/error.h"
#include "queue/batch_store_backend.h"
#include "queue/sqlite_db.h"

namespace moebatch {
namespace {

BatchRecord read_batch(const Stmt& s) {
  BatchRecord b;
  b.id = s.text(0);
  b.input_file_id = s.text(1);
  b.endpoint = s.text(2);
  b.completion_window = s.text(3);
  b.metadata = s.opt_text(4);
  b.status = s.text(5);
  b.total = s.i64(6);
  b.errors = s.opt_text(7);
  b.output_file_id = s.opt_text(8);
  b.error_file_id = s.opt_text(9);
  b.created_at = s.i64(10);
  b.in_progress_at = s.opt_i64(11);
  b.finalizing_at = s.opt_i64(12);
  b.completed_at = s.opt_i64(13);
  b.failed_at = s.opt_i64(14);
  b.cancelling_at = s.opt_i64(15);
  b.cancelled_at = s.opt_i64(16);
  b.expires_at = s.opt_i64(17);
  return b;
}

// A file's pieces as file_chunks rows 0, 1, ... (inside the caller's transaction).
void insert_pieces(Db& db, std::string_view id, const std::vector<std::string_view>& pieces) {
  int64_t seq = 0;
  for (std::string_view piece : pieces) {
    Stmt& c = db.prepare("INSERT INTO file_chunks (file_id, seq, data) VALUES (?1, ?2, ?3)");
    c.bind(1, id).bind(2, seq++).bind(3, piece);
    c.step();
  }
}

// The file's row and its content's pieces (inside the caller's transaction).
void insert_file(Db& db, const StoredFile& f, std::string_view content) {
  Stmt& s = db.prepare(
      "INSERT INTO files (id, purpose, filename, bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5)");
  s.bind(1, std::string_view(f.id)).bind(2, std::string_view(f.purpose));
  s.bind(3, std::string_view(f.filename)).bind(4, f.bytes).bind(5, f.created_at);
  s.step();
  insert_pieces(db, f.id, split_file_content(content));
}

class SqliteBatchStore final : public BatchStoreBackend {
 public:
  explicit SqliteBatchStore(const std::string& path) : db_(std::make_unique<Db>(path)) {
    SQLITE_CHECK(db_->get(), sqlite3_busy_timeout(db_->get(), 5000));
    db_->exec("PRAGMA journal_mode=WAL");
    MB_CHECK(db_->query_i64(
                 "SELECT count(*) FROM sqlite_master WHERE name IN ('files', 'batches')") == 2,
             "the database has no files/batches tables (open a JobStore first to migrate it)");
  }

  void add_file(const StoredFile& f, const std::string& content) override {
    Transaction tx(*db_, true);
    insert_file(*db_, f, content);
    tx.commit();
  }

  std::optional<StoredFile> file(const std::string& id) override {
    Stmt& s =
        db_->prepare("SELECT id, purpose, filename, bytes, created_at FROM files WHERE id = ?1");
    s.bind(1, std::string_view(id));
    if (!s.step()) return std::nullopt;
    StoredFile f{s.text(0), s.text(1), s.text(2), s.i64(3), s.i64(4)};
    s.reset();
    return f;
  }

  std::optional<std::string> file_content(const std::string& id) override {
    // One read transaction, so a delete between the row and its pieces cannot split them.
    Transaction tx(*db_, false);
    if (!file(id)) return std::nullopt;
    Stmt& s = db_->prepare("SELECT data FROM file_chunks WHERE file_id = ?1 ORDER BY seq");
    s.bind(1, std::string_view(id));
    std::string content;
    while (s.step()) content += s.text(0);
    tx.commit();
    return content;
  }

  std::vector<std::string> files_in_one_large_piece(int64_t max_bytes) override {
    Stmt& s = db_->prepare(
        "SELECT f.id FROM files f WHERE f.bytes > ?1 AND NOT EXISTS "
        "(SELECT 1 FROM file_chunks c WHERE c.file_id = f.id AND c.seq = 1)");
    s.bind(1, max_bytes);
    std::vector<std::string> ids;
    while (s.step()) ids.push_back(s.text(0));
    s.reset();
    return ids;
  }

  bool recut_file(const std::string& id, const std::vector<std::string_view>& pieces) override {
    Transaction tx(*db_, true);  // a write transaction from the start: one opener at a time
    Stmt& n = db_->prepare("SELECT count(*) FROM file_chunks WHERE file_id = ?1");
    n.bind(1, std::string_view(id));
    const int64_t count = n.step() ? n.i64(0) : 0;
    n.reset();
    if (count != 1) return false;
    Stmt& d = db_->prepare("DELETE FROM file_chunks WHERE file_id = ?1");
    d.bind(1, std::string_view(id));
    d.step();
    insert_pieces(*db_, id, pieces);
    tx.commit();
    return true;
  }

  std::optional<std::string> file_chunk(const std::string& id, int64_t seq) override {
    Stmt& s = db_->prepare("SELECT data FROM file_chunks WHERE file_id = ?1 AND seq = ?2");
    s.bind(1, std::string_view(id)).bind(2, seq);
    if (!s.step()) return std::nullopt;
    std::string piece = s.text(0);
    s.reset();
    return piece;
  }

  std::vector<StoredFile> list_files(const std::optional<std::string>& after, int64_t limit,
                                     const std::optional<std::string>& purpose) override {
    Stmt& s = db_->prepare(
        "SELECT id, purpose, filename, bytes, created_at FROM files WHERE (?1 IS NULL OR rowid < "
        "(SELECT rowid FROM files WHERE id = ?1)) AND (?2 IS NULL OR purpose = ?2) "
        "ORDER BY rowid DESC LIMIT ?3");
    s.bind(1, after).bind(2, purpose).bind(3, limit);
    std::vector<StoredFile> out;
    while (s.step()) out.push_back({s.text(0), s.text(1), s.text(2), s.i64(3), s.i64(4)});
    return out;
  }

  bool delete_file(const std::string& id) override {
    Transaction tx(*db_, true);
    Stmt& s = db_->prepare("DELETE FROM files WHERE id = ?1");
    s.bind(1, std::string_view(id));
    s.step();
    const bool gone = db_->changes() > 0;
    Stmt& c = db_->prepare("DELETE FROM file_chunks WHERE file_id = ?1");
    c.bind(1, std::string_view(id));
    c.step();
    tx.commit();
    return gone;
  }

  void add_batch(const BatchRecord& b) override {
    Transaction tx(*db_, true);
    Stmt& s = db_->prepare(
        "INSERT INTO batches (id, input_file_id, endpoint, completion_window, metadata, status, "
        "created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, 'validating', ?6, ?7)");
    s.bind(1, std::string_view(b.id)).bind(2, std::string_view(b.input_file_id));
    s.bind(3, std::string_view(b.endpoint)).bind(4, std::string_view(b.completion_window));
    s.bind(5, b.metadata).bind(6, b.created_at).bind(7, b.expires_at);
    s.step();
    tx.commit();
  }

  std::optional<BatchRecord> batch(const std::string& id) override {
    Stmt& s = db_->prepare(std::string("SELECT ") + kBatchColumns + " FROM batches WHERE id = ?1");
    s.bind(1, std::string_view(id));
    if (!s.step()) return std::nullopt;
    BatchRecord b = read_batch(s);
    s.reset();
    return b;
  }

  std::vector<BatchRecord> list_batches(const std::optional<std::string>& after,
                                        int64_t limit) override {
    // rowid order is insertion order: newest first, and `after` pages on from a known id.
    Stmt& s =
        db_->prepare(std::string("SELECT ") + kBatchColumns +
                     " FROM batches WHERE ?1 IS NULL OR rowid < "
                     "(SELECT rowid FROM batches WHERE id = ?1) ORDER BY rowid DESC LIMIT ?2");
    s.bind(1, after).bind(2, limit);
    std::vector<BatchRecord> out;
    while (s.step()) out.push_back(read_batch(s));
    return out;
  }

  std::vector<BatchRecord> batches_with_status(const std::string& status) override {
    Stmt& s = db_->prepare(std::string("SELECT ") + kBatchColumns +
                           " FROM batches WHERE status = ?1 ORDER BY rowid");
    s.bind(1, std::string_view(status));
    std::vector<BatchRecord> out;
    while (s.step()) out.push_back(read_batch(s));
    return out;
  }

  bool transition(const std::string& id, const std::string& from, const std::string& to,
                  const std::string& at_column, int64_t now_s, std::optional<int64_t> total,
                  const std::optional<std::string>& errors) override {
    Transaction tx(*db_, true);
    Stmt& s = db_->prepare("UPDATE batches SET status = ?3, " + at_column +
                           " = ?4, total = coalesce(?5, total), errors = coalesce(?6, errors) "
                           "WHERE id = ?1 AND status = ?2");
    s.bind(1, std::string_view(id)).bind(2, std::string_view(from)).bind(3, std::string_view(to));
    s.bind(4, now_s).bind(5, total).bind(6, errors);
    s.step();
    const bool moved = db_->changes() > 0;
    tx.commit();
    return moved;
  }

  bool finish(const std::string& id, const std::string& from, const std::string& to,
              const std::string& at_column, const std::vector<StoredFile>& files,
              const std::vector<std::string_view>& contents,
              const std::optional<std::string>& output_id,
              const std::optional<std::string>& error_id, int64_t now_s) override {
    Transaction tx(*db_, true);
    Stmt& check = db_->prepare("SELECT status FROM batches WHERE id = ?1");
    check.bind(1, std::string_view(id));
    const bool there = check.step() && check.text(0) == from;
    check.reset();
    if (!there) return false;
    for (size_t i = 0; i < files.size(); ++i) insert_file(*db_, files[i], contents[i]);
    Stmt& s = db_->prepare("UPDATE batches SET status = ?2, finalizing_at = ?3, " + at_column +
                           " = ?3, output_file_id = ?4, error_file_id = ?5 WHERE id = ?1");
    s.bind(1, std::string_view(id)).bind(2, std::string_view(to)).bind(3, now_s);
    s.bind(4, output_id).bind(5, error_id);
    s.step();
    tx.commit();
    return true;
  }

 private:
  std::unique_ptr<Db> db_;
};

}  // namespace

std::unique_ptr<BatchStoreBackend> make_sqlite_batch_store(const std::string& path) {
  return std::make_unique<SqliteBatchStore>(path);
}

}  // namespace moebatch
