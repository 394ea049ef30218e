#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace moebatch {

/// Default job database: $MOEBATCH_DB, else $XDG_DATA_HOME/moebatch/jobs.db, else
/// ~/.local/share/moebatch/jobs.db. The parent directory is not created here.
std::filesystem::path default_db_path();

/// The whole file, refused (InputError naming the file) when unreadable or over `limit` bytes —
/// checked before reading, so an oversized input costs no memory.
std::string read_file_limited(const std::filesystem::path& path, std::size_t limit);

}  // namespace moebatch
