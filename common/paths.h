#pragma once

#include <filesystem>

namespace moebatch {

/// Default job database: $MOEBATCH_DB, else $XDG_DATA_HOME/moebatch/jobs.db, else
/// ~/.local/share/moebatch/jobs.db. The parent directory is not created here.
std::filesystem::path default_db_path();

}  // namespace moebatch
