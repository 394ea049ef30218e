// Where a job store lives, as given by --db / StoreOptions::path / the `db` config key: a SQLite
// file path, or a postgresql:// (postgres://) URL of a PostgreSQL database. Anything else that
// looks like a URL (`scheme://...`) is refused, so a mistyped or unsupported scheme can never
// become a SQLite file under a directory named after it.
#pragma once

#include <string>
#include <string_view>

namespace moebatch {

/// Which store implementation a location selects.
enum class StoreKind { Sqlite, Postgres };

/// A parsed --db value.
struct StoreLocation {
  StoreKind kind = StoreKind::Sqlite;  ///< implementation
  std::string target;                  ///< the file path, or the URL handed to libpq
};

/// Parses a --db value. InputError for an empty value, a `scheme://` other than postgresql:// or
/// postgres://, and a PostgreSQL URL without a database name.
StoreLocation parse_store_location(std::string_view db);

/// The location for logs and error messages: a URL's password is replaced by "***".
std::string store_location_for_display(std::string_view db);

/// Prepares a location for use: validates it, and for a SQLite file creates its parent
/// directory. Returns the parsed location. InputError when the directory cannot be created.
StoreLocation prepare_store_location(std::string_view db);

}  // namespace moebatch
