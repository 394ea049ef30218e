// A producer's SQL row as the claim path decodes it: the input describes one INSERT into the
// jobs table, made on a raw connection as an external producer makes it (schemas/README.md);
// then JobStore::claim reads, validates and leases it (queue/job_row.*, queue/job_validate.*)
// and prepare_work tokenizes it with the bundled Qwen3 tokenizer (service/job_codec.*). A row
// the database accepts is either failed with a reason inside claim or claimed as a valid job
// that becomes a WorkItem within the intake limits or a reason; nothing throws.
//
// Input: one "column=value" per line; value "null", "i:<integer>", "r:<real>", "x:<hex blob>",
// anything else is text with \n, \t, \\, \0 and \xHH escapes. Unknown columns are skipped.
#include <sqlite3.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "engine/tokenizer/tokenizer.h"
#include "queue/job_store.h"
#include "service/job_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace moebatch;

struct Value {
  enum Kind { Null, Int, Real, Text, Blob } kind = Null;
  int64_t i = 0;
  double r = 0;
  std::string s;
};

// Every column of the jobs table (schemas/jobs.sql), space-separated and space-padded.
constexpr std::string_view kColumns =
    " id client_key batch_id custom_id model priority prompt_kind prompt max_tokens temperature"
    " top_p top_k seed stop state attempts max_attempts lease_owner lease_expires_at error"
    " enqueued_at not_before started_at first_token_at finished_at result_text prompt_tokens"
    " completion_tokens finish_reason chat_template_kwargs payload_hash lease_token ";

bool is_column(std::string_view name) {
  return !name.empty() && name.find(' ') == std::string_view::npos &&
         kColumns.find(" " + std::string(name) + " ") != std::string_view::npos;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string unescape(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != '\\' || i + 1 == v.size()) {
      out.push_back(v[i]);
      continue;
    }
    const char c = v[++i];
    if (c == 'n')
      out.push_back('\n');
    else if (c == 't')
      out.push_back('\t');
    else if (c == '0')
      out.push_back('\0');
    else if (c == 'x' && i + 2 < v.size() && hex_digit(v[i + 1]) >= 0 && hex_digit(v[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(v[i + 1]) * 16 + hex_digit(v[i + 2])));
      i += 2;
    } else
      out.push_back(c);
  }
  return out;
}

Value parse_value(std::string_view v) {
  Value out;
  if (v == "null") return out;
  const std::string_view rest = v.size() >= 2 ? v.substr(2) : std::string_view();
  if (v.starts_with("i:")) {
    const auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), out.i);
    if (ec == std::errc() && p == rest.data() + rest.size()) {
      out.kind = Value::Int;
      return out;
    }
  } else if (v.starts_with("r:")) {
    const std::string s(rest);
    char* end = nullptr;
    out.r = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) {
      out.kind = Value::Real;
      return out;
    }
  } else if (v.starts_with("x:")) {
    out.kind = Value::Blob;
    for (size_t i = 0; i + 1 < rest.size(); i += 2) {
      const int hi = hex_digit(rest[i]), lo = hex_digit(rest[i + 1]);
      if (hi < 0 || lo < 0) break;
      out.s.push_back(static_cast<char>(hi * 16 + lo));
    }
    return out;
  }
  out.kind = Value::Text;
  out.s = unescape(v);
  return out;
}

std::map<std::string, Value> parse_row(std::string_view in) {
  std::map<std::string, Value> row;
  while (!in.empty()) {
    const size_t nl = in.find('\n');
    const std::string_view line = in.substr(0, nl);
    in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, eq);
    if (is_column(name)) row[std::string(name)] = parse_value(line.substr(eq + 1));
  }
  return row;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The bundled Qwen3 tokenizer (normalizer, pre-tokenizer regex, added tokens, chat template)
// with only its 256 byte-level tokens and no merges: the same code paths and token ids in a
// small heap (the full vocabulary takes seconds to load under ASan and slows every
// LeakSanitizer scan).
Tokenizer small_qwen3_tokenizer() {
  const std::filesystem::path dir = MOEBATCH_TEST_DATA "/qwen3-tokenizer";
  auto j = nlohmann::json::parse(read_file(dir / "tokenizer.json"));
  nlohmann::json bytes = nlohmann::json::object();
  for (const auto& [token, id] : j["model"]["vocab"].items()) {
    if (id.get<int64_t>() < 256) bytes[token] = id;
  }
  j["model"]["vocab"] = std::move(bytes);
  j["model"]["merges"] = nlohmann::json::array();
  return Tokenizer::from_json(j.dump(), read_file(dir / "tokenizer_config.json"));
}

// The store under test and a second, raw connection to the same file: the producer.
struct Fixture {
  std::filesystem::path dir;
  std::unique_ptr<JobStore> store;
  sqlite3* producer = nullptr;
  Tokenizer tokenizer = small_qwen3_tokenizer();
  IntakeLimits limits;

  Fixture() {
    dir = fuzz::scratch_path(".db.d");
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    StoreOptions o;
    o.path = dir / "jobs.db";
    store = std::make_unique<JobStore>(o);
    if (sqlite3_open(o.path.c_str(), &producer) != SQLITE_OK) std::abort();
    sqlite3_busy_timeout(producer, 5000);
    limits.max_model_len = 4096;
    limits.max_prompt_tokens = 4096;
    limits.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  }
  ~Fixture() {
    sqlite3_close(producer);
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

bool insert(sqlite3* db, const std::map<std::string, Value>& row) {
  std::string cols, params;
  for (const auto& [name, v] : row) {
    cols += (cols.empty() ? "" : ", ") + name;
    params += params.empty() ? "?" : ", ?";
  }
  const std::string sql = "INSERT INTO jobs (" + cols + ") VALUES (" + params + ")";
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) std::abort();
  int i = 1;
  for (const auto& [name, v] : row) {
    switch (v.kind) {
      case Value::Null:
        sqlite3_bind_null(st, i);
        break;
      case Value::Int:
        sqlite3_bind_int64(st, i, v.i);
        break;
      case Value::Real:
        sqlite3_bind_double(st, i, v.r);
        break;
      case Value::Text:
        sqlite3_bind_text(st, i, v.s.data(), static_cast<int>(v.s.size()), SQLITE_TRANSIENT);
        break;
      case Value::Blob:
        sqlite3_bind_blob(st, i, v.s.data(), static_cast<int>(v.s.size()), SQLITE_TRANSIENT);
        break;
    }
    ++i;
  }
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE;  // a constraint the schema enforces refused the row otherwise
}

Fixture* fixture = nullptr;

}  // namespace

// The fixture is built once, before the first input: under ASan on a loaded machine loading the
// tokenizer took more than libFuzzer's per-input timeout, which then blamed the first input.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new Fixture();  // lives until exit
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = *fixture;
  const auto row = parse_row(fuzz::as_text(data, size));
  if (row.empty() || !insert(f.producer, row)) return 0;
  const std::vector<Job> claimed = f.store->claim("fuzz", 4, std::chrono::seconds(60));
  for (const Job& job : claimed) {
    if (find_job_spec_error(job.spec, f.store->options().limits)) __builtin_trap();
    const auto work = prepare_work(job, f.tokenizer, f.limits);
    if (const auto* w = std::get_if<WorkItem>(&work)) {
      const auto n = static_cast<int64_t>(w->prompt.size());
      if (n == 0 || n > f.limits.max_prompt_tokens || w->max_tokens < 1 ||
          n + w->max_tokens > f.limits.max_model_len) {
        __builtin_trap();
      }
      for (int32_t id : w->prompt) {
        if (id < 0 || id >= f.limits.vocab_size) __builtin_trap();
      }
    } else if (std::get<std::string>(work).empty()) {
      __builtin_trap();
    }
  }
  if (sqlite3_exec(f.producer, "DELETE FROM jobs", nullptr, nullptr, nullptr) != SQLITE_OK) {
    std::abort();
  }
  return 0;
}
