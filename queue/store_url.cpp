#include "queue/store_url.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <system_error>

#include "common/error.h"

namespace moebatch {
namespace {

// The scheme of "scheme://rest" (RFC 3986: a letter, then letters, digits, '+', '-', '.'), or
// empty when s does not start like a URL.
std::string_view url_scheme(std::string_view s) {
  const size_t sep = s.find("://");
  if (sep == std::string_view::npos || sep == 0) return {};
  const std::string_view scheme = s.substr(0, sep);
  if (!std::isalpha(static_cast<unsigned char>(scheme[0]))) return {};
  for (char c : scheme) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return {};
  }
  return scheme;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The database name of a postgresql:// URL: the path after the authority, up to '?'. libpq
// would fall back to the user name; a queue must name its database.
std::string_view url_dbname(std::string_view url) {
  std::string_view rest = url.substr(url.find("://") + 3);
  const size_t q = rest.find('?');
  std::string_view query = q == std::string_view::npos ? std::string_view() : rest.substr(q + 1);
  rest = rest.substr(0, q);
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos && slash + 1 < rest.size()) return rest.substr(slash + 1);
  // dbname=... given as a query parameter.
  size_t pos = 0;
  while (pos < query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string_view::npos) amp = query.size();
    std::string_view kv = query.substr(pos, amp - pos);
    if (kv.substr(0, 7) == "dbname=" && kv.size() > 7) return kv.substr(7);
    pos = amp + 1;
  }
  return {};
}

}  // namespace

StoreLocation parse_store_location(std::string_view db) {
  if (db.empty()) throw InputError("db: the job database location is empty");
  const std::string_view scheme = url_scheme(db);
  if (scheme.empty()) return {StoreKind::Sqlite, std::string(db)};
  const std::string s = lower(scheme);
  if (s != "postgresql" && s != "postgres") {
    throw InputError("db: unsupported scheme '" + std::string(scheme) +
                     "://' (a SQLite file path or a postgresql://user@host:port/dbname URL)");
  }
  if (url_dbname(db).empty()) {
    throw InputError("db: " + store_location_for_display(db) +
                     " names no database (postgresql://user@host:port/dbname)");
  }
  return {StoreKind::Postgres, std::string(db)};
}

std::string store_location_for_display(std::string_view db) {
  if (url_scheme(db).empty()) return std::string(db);
  std::string out(db);
  // postgresql://user:password@host/...: hide what lies between the user's ':' and the '@'.
  const size_t start = out.find("://") + 3;
  size_t end = out.find_first_of("/?", start);
  if (end == std::string::npos) end = out.size();
  const size_t at = out.rfind('@', end);
  if (at != std::string::npos && at >= start) {
    const size_t colon = out.find(':', start);
    if (colon < at) out.replace(colon + 1, at - colon - 1, "***");
  }
  // A password may also travel as a query parameter.
  const size_t pw = out.find("password=");
  if (pw != std::string::npos) {
    const size_t amp = out.find('&', pw);
    out.replace(pw + 9, (amp == std::string::npos ? out.size() : amp) - pw - 9, "***");
  }
  return out;
}

StoreLocation prepare_store_location(std::string_view db) {
  StoreLocation loc = parse_store_location(db);
  if (loc.kind != StoreKind::Sqlite) return loc;
  const std::filesystem::path path(loc.target);
  if (path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) {
      throw InputError("cannot create directory '" + path.parent_path().string() +
                       "' for the job database: " + ec.message());
    }
  }
  return loc;
}

}  // namespace moebatch
