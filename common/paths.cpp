#include "common/paths.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace moebatch {

std::filesystem::path default_db_path() {
  if (const char* db = std::getenv("MOEBATCH_DB"); db && *db) return db;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) {
    return std::filesystem::path(xdg) / "moebatch" / "jobs.db";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return std::filesystem::path(home) / ".local" / "share" / "moebatch" / "jobs.db";
  }
  return std::filesystem::path("moebatch-jobs.db");
}

std::string read_file_limited(const std::filesystem::path& path, std::size_t limit) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError(path.string() + ": cannot read: " + ec.message());
  if (size > limit) {
    throw InputError(path.string() + ": " + std::to_string(size) + " bytes, over the limit of " +
                     std::to_string(limit));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace moebatch
