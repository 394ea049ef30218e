#include "common/paths.h"

#include <cstdlib>

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

}  // namespace moebatch
