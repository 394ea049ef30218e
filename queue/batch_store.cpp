// BatchStore: ids, argument checks and the status timestamps; the SQL is the backend's
// (sqlite_batch_store.cpp, pg_batch_store.cpp).
#include "queue/batch_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "common/error.h"
#include "queue/batch_store_backend.h"
#include "queue/store_url.h"

namespace moebatch {
namespace {

// 96 random bits in hex: ids that do not reveal how many files or batches exist, and that
// hosts sharing one database pick without coordinating.
std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

// The timestamp column a status sets when a batch enters it (also what keeps `to` out of the
// SQL text unless it is one of these names).
std::string at_column(const std::string& status) {
  if (status == "in_progress" || status == "finalizing" || status == "completed" ||
      status == "failed" || status == "cancelling" || status == "cancelled")
    return status + "_at";
  throw Error("batch status '" + status + "' has no timestamp");
}

// Pages of `limit` + 1 rows tell whether there is more.
template <class T>
std::vector<T> page(std::vector<T> rows, int64_t limit, bool& has_more) {
  has_more = static_cast<int64_t>(rows.size()) > limit;
  if (has_more) rows.pop_back();
  return rows;
}

// Files stored before migration 10 are one piece each, as the migration moved them (SQL cannot
// cut text at character boundaries without reading it from its start for every piece): each
// past kFileChunkBytes is read whole once, here, and cut as a new file is, so that no download
// reads more than a piece at a time. A failure leaves the file as it was (downloads still work,
// reading it whole) and is logged; the next open tries again.
void recut_legacy_files(BatchStoreBackend& b) {
  try {
    for (const std::string& id : b.files_in_one_large_piece(static_cast<int64_t>(kFileChunkBytes))) {
      const std::optional<std::string> content = b.file_chunk(id, 0);
      if (!content || content->size() <= kFileChunkBytes) continue;
      const std::vector<std::string_view> pieces = split_file_content(*content);
      if (b.recut_file(id, pieces))
        spdlog::info("file {}: its content ({} bytes, stored before migration 10) is now {} pieces", id,
                     content->size(), pieces.size());
    }
  } catch (const std::exception& e) {
    spdlog::warn("cutting files stored before migration 10 into pieces failed ({}); they are read whole",
                 e.what());
  }
}

}  // namespace

std::vector<std::string_view> split_file_content(std::string_view content, size_t max_bytes) {
  MB_CHECK(max_bytes >= 4, "split_file_content: pieces must hold a character");
  std::vector<std::string_view> pieces;
  while (!content.empty()) {
    size_t n = std::min(max_bytes, content.size());
    if (n < content.size()) {
      const auto continues = [&](size_t i) {
        return (static_cast<unsigned char>(content[i]) & 0xC0) == 0x80;
      };
      size_t cut = n;
      while (cut > n - 3 && continues(cut)) --cut;
      if (!continues(cut)) n = cut;  // else not UTF-8 here: cut where it falls
    }
    pieces.push_back(content.substr(0, n));
    content.remove_prefix(n);
  }
  return pieces;
}

BatchStore::BatchStore(const std::string& location) {
  const StoreLocation loc = parse_store_location(location);
  impl_ = loc.kind == StoreKind::Postgres ? make_pg_batch_store(loc.target)
                                          : make_sqlite_batch_store(loc.target);
  recut_legacy_files(*impl_);
}

BatchStore::~BatchStore() = default;

StoredFile BatchStore::add_file(const std::string& purpose, const std::string& filename,
                                const std::string& content, int64_t now_s) {
  StoredFile f{random_id("file-"), purpose, filename, static_cast<int64_t>(content.size()), now_s};
  impl_->add_file(f, content);
  return f;
}

std::optional<StoredFile> BatchStore::file(const std::string& id) { return impl_->file(id); }

std::optional<std::string> BatchStore::file_content(const std::string& id) {
  return impl_->file_content(id);
}

std::optional<std::string> BatchStore::file_chunk(const std::string& id, int64_t seq) {
  MB_CHECK(seq >= 0, "file_chunk: seq must be >= 0");
  return impl_->file_chunk(id, seq);
}

std::vector<StoredFile> BatchStore::list_files(const std::optional<std::string>& after,
                                               int64_t limit,
                                               const std::optional<std::string>& purpose,
                                               bool& has_more) {
  MB_CHECK(limit >= 1, "list_files: limit must be >= 1");
  return page(impl_->list_files(after, limit + 1, purpose), limit, has_more);
}

bool BatchStore::delete_file(const std::string& id) { return impl_->delete_file(id); }

BatchRecord BatchStore::add_batch(BatchRecord b) {
  b.id = random_id("batch_");
  b.status = "validating";
  impl_->add_batch(b);
  return b;
}

std::optional<BatchRecord> BatchStore::batch(const std::string& id) { return impl_->batch(id); }

std::vector<BatchRecord> BatchStore::list_batches(const std::optional<std::string>& after,
                                                  int64_t limit, bool& has_more) {
  MB_CHECK(limit >= 1, "list_batches: limit must be >= 1");
  return page(impl_->list_batches(after, limit + 1), limit, has_more);
}

std::vector<BatchRecord> BatchStore::batches_with_status(const std::vector<std::string>& statuses) {
  std::vector<BatchRecord> out;
  for (const std::string& st : statuses) {
    for (BatchRecord& b : impl_->batches_with_status(st)) out.push_back(std::move(b));
  }
  return out;
}

bool BatchStore::transition(const std::string& id, const std::string& from, const std::string& to,
                            int64_t now_s, std::optional<int64_t> total,
                            const std::optional<std::string>& errors) {
  return impl_->transition(id, from, to, at_column(to), now_s, total, errors);
}

bool BatchStore::finish(const std::string& id, const std::string& from, const std::string& to,
                        const std::string& output, const std::string& errors, int64_t now_s) {
  const std::string column = at_column(to);
  std::vector<StoredFile> files;
  std::vector<std::string_view> contents;
  std::optional<std::string> out_id, err_id;
  auto add = [&](const std::string& content, const char* suffix) {
    files.push_back({random_id("file-"), "batch_output", id + suffix,
                     static_cast<int64_t>(content.size()), now_s});
    contents.push_back(content);
    return files.back().id;
  };
  if (!output.empty()) out_id = add(output, "_output.jsonl");
  if (!errors.empty()) err_id = add(errors, "_error.jsonl");
  return impl_->finish(id, from, to, column, files, contents, out_id, err_id, now_s);
}


}  // namespace moebatch
