#include "cli/queue_cli.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <ctime>

#include "common/paths.h"
#include "queue/job_validate.h"
#include "queue/store_url.h"

namespace moebatch::cli {

using nlohmann::json;

void add_common(CLI::App* cmd, CommonFlags& f) {
  cmd->add_option("--db", f.db, "Job database (default $MOEBATCH_DB or the user data dir)");
  cmd->add_flag("--json", f.json, "Print JSON instead of text");
}

void add_remote(CLI::App* cmd, zmq_ingress::RemoteSubmitFlags& f) {
  cmd->add_option("--endpoint", f.endpoint,
                  "Go through a ZeroMQ ingress (tcp://...) instead of --db, retrying "
                  "Lazy-Pirate style");
  cmd->add_option("--timeout-ms", f.timeout_ms, "--endpoint: wait per try (3000)")
      ->transform(decimal_int());
  cmd->add_option("--attempts", f.attempts, "--endpoint: tries before giving up (4)")
      ->transform(decimal_int());
  cmd->add_option("--curve-server-key", f.curve_server_key,
                  "--endpoint: server public key file (enables CURVE)");
  cmd->add_option("--curve-secret", f.curve_secret, "--endpoint: client secret key file (CURVE)");
}

std::unique_ptr<JobStore> open_store(const CommonFlags& f) {
  const std::string db = f.db.empty() ? default_db_path().string() : f.db;
  StoreOptions o;
  o.path = prepare_store_location(db).target;
  return std::make_unique<JobStore>(o);
}

std::string printable(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto hex = [](std::string& out, const char* prefix, unsigned v) {
    out += prefix;
    out.push_back(kHex[(v >> 4) & 15]);
    out.push_back(kHex[v & 15]);
  };
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      hex(out, "\\x", c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size() || !is_valid_utf8(s.substr(i, len))) {
      hex(out, "\\x", c);
      ++i;
      continue;
    }
    if (c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) {
      hex(out, "\\u00", static_cast<unsigned char>(s[i + 1]));  // C1 control, U+0080..U+009F
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

CLI::Validator decimal_int() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range) return "'" + s + "' is out of the 64-bit range";
        if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
          return "'" + s + "' is not a decimal integer";
        }
        s = std::to_string(v);  // canonical: CLI11 would read "010" as octal
        return "";
      },
      "INT");
}

std::string format_time(std::optional<int64_t> ms) {
  if (!ms) return "-";
  std::time_t secs = static_cast<std::time_t>(*ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return std::string(buf) + "." + fmt::format("{:03d}", static_cast<int>(*ms % 1000)) + "Z";
}

bool progress_wanted(bool no_progress) { return !no_progress && ::isatty(STDERR_FILENO); }

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputc('\n', stderr);
}

void ProgressBar::update(size_t done, size_t total, const std::string& suffix) {
  if (!on_ || total == 0) return;
  const int width = 40;
  const auto filled = static_cast<int>(width * std::min(done, total) / total);
  // \033[K clears what a longer previous suffix left on the line.
  std::fprintf(stderr, "\r%s [%s%s] %zu/%zu%s\033[K", label_.c_str(),
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
               total, suffix.c_str());
  drawn_ = true;
}

}  // namespace moebatch::cli
