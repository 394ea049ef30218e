#include "service/config.h"

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/paths.h"
#include "engine/packed_weights.h"
#include "queue/store_url.h"
#include "service/restart_schedule.h"

namespace moebatch {
namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;

// One table of keys drives the JSON reader, the printer and the flags, so the three cannot
// drift apart. Each entry knows its bounds.
struct IntKey {
  const char* name;
  int64_t ServiceConfig::*field;
  int64_t lo, hi;
  const char* help;
};
struct SmallIntKey {
  const char* name;
  int ServiceConfig::*field;
  int lo, hi;
  const char* help;
};
struct StrKey {
  const char* name;
  std::string ServiceConfig::*field;
  size_t max_bytes;
  const char* help;
};

const IntKey kIntKeys[] = {
    {"kv_cache_mb", &ServiceConfig::kv_cache_mb, 0, int64_t{1} << 20,
     "KV cache, MiB over all ranks; cpu: the pool (0 = 256), cuda: a cap (0 = all the memory "
     "plan leaves) (default 0)"},
    {"max_num_seqs", &ServiceConfig::max_num_seqs, 1, 4096, "Batch slots (default 64)"},
    {"max_num_batched_tokens", &ServiceConfig::max_num_batched_tokens, 1, 1 << 20,
     "Tokens per engine step (default 4096)"},
    {"static_batch_wait_ms", &ServiceConfig::static_batch_wait_ms, 0, 600000,
     "Static batching: longest wait for a full batch (default 200)"},
    {"max_model_len", &ServiceConfig::max_model_len, 0, 1 << 24,
     "Cap on prompt + max_tokens; 0 = model context (default 0)"},
    {"max_prompt_tokens", &ServiceConfig::max_prompt_tokens, 1, 1 << 24,
     "Cap on the rendered prompt length (default 32768)"},
    {"lease_s", &ServiceConfig::lease_s, 1, 86400,
     "Job lease in seconds, renewed while running (default 60)"},
    {"poll_ms", &ServiceConfig::poll_ms, 1, 60000,
     "Poll period for external inserts, ms (default 50)"},
    {"drain_timeout_s", &ServiceConfig::drain_timeout_s, 0, 86400,
     "Maintenance: wait for in-flight work, then requeue (default 60)"},
    {"shutdown_timeout_s", &ServiceConfig::shutdown_timeout_s, 0, 86400,
     "SIGTERM: wait for in-flight work, then requeue (default 30)"},
    {"warmup_seqs", &ServiceConfig::warmup_seqs, 0, 4096,
     "Sequences in the warmup batch after a (re)build (default 4)"},
    {"health_stall_s", &ServiceConfig::health_stall_s, 1, 86400,
     "/health fails when work is pending and no step ran this long (default 60)"},
    {"http_max_connections", &ServiceConfig::http_max_connections, 1, 100000,
     "Open HTTP connections at most; beyond: 503 (default 256)"},
    {"http_max_connections_per_address", &ServiceConfig::http_max_connections_per_address, 1,
     100000,
     "Open HTTP connections from one address other than loopback; beyond: 503, so one host "
     "cannot hold them all (default 128)"},
    {"http_min_send_kib_s", &ServiceConfig::http_min_send_kib_s, 0, 1 << 20,
     "KiB a second a reply of known length (a file download) must average after its first "
     "60 s, or the connection is cut, so a slow reader cannot hold it for hours; 0 = no floor "
     "(default 64)"},
    {"api_priority", &ServiceConfig::api_priority, -1000000, 1000000,
     "Queue priority of OpenAI API requests; batch jobs default to 0 (default 1000)"},
    {"api_max_pending", &ServiceConfig::api_max_pending, 1, 1000000,
     "OpenAI API requests open at once; beyond: 429 (default 256)"},
    {"batch_output_max_mb", &ServiceConfig::batch_output_max_mb, 1, 900,
     "A Batch API batch's output and error files together at most, MiB; a larger batch fails, "
     "its results stay in the job table for `moebatch export` (default 512; SQLite holds a "
     "file of up to ~950)"},
    {"store_busy_timeout_ms", &ServiceConfig::store_busy_timeout_ms, 100, 600000,
     "Job store locked by another writer this long: /health reports it unwritable (results "
     "are kept and retried meanwhile; the io thread waits at most 200 ms a try) (default 5000)"},
    {"collective_timeout_s", &ServiceConfig::collective_timeout_s, 1, 86400,
     "cuda, --tp > 1: a step stuck this long in a collective fails the engine, which the "
     "service rebuilds (default 120)"},
    {"log_stats_interval_s", &ServiceConfig::log_stats_interval_s, 0, 86400,
     "Log a throughput line this often while there is work; 0 = never (default 10)"},
};
const SmallIntKey kSmallIntKeys[] = {
    {"tp", &ServiceConfig::tp, 1, 64, "Tensor-parallel ranks (default 1)"},
    {"threads", &ServiceConfig::threads, 0, 4096, "CPU compute threads; 0 = all cores"},
    {"http_port", &ServiceConfig::http_port, -1, 65535,
     "HTTP port (health, metrics, OpenAI API); 0 = any free; -1 = off (default 9464)"},
    {"metrics_port", &ServiceConfig::metrics_port, -1, 65535,
     "A second listener with /metrics and /health only, no API; 0 = any free; -1 = off "
     "(default -1)"},
};
const StrKey kStrKeys[] = {
    {"db", &ServiceConfig::db, 4096,
     "Job database (default $MOEBATCH_DB or ~/.local/share/moebatch/jobs.db)"},
    {"model", &ServiceConfig::model, 4096,
     "Checkpoint directory (config.json + *.safetensors), a .gguf file, or random:<shape>"},
    {"tokenizer", &ServiceConfig::tokenizer, 4096,
     "Tokenizer directory (default: the model directory)"},
    {"backend", &ServiceConfig::backend, 16,
     "cpu | cuda (default cpu); cuda needs a CUDA build and a visible GPU"},
    {"restart_at", &ServiceConfig::restart_at, 128,
     "Maintenance cycle: HH:MM local time or a 5-field cron expression ('0 3 * * 1-5', "
     "'30 2 * * sun', '@daily'); empty = off"},
    {"http_host", &ServiceConfig::http_host, 64,
     "HTTP address; beyond loopback only with --api-key-file (default 127.0.0.1)"},
    {"api_key_file", &ServiceConfig::api_key_file, 4096,
     "Bearer API keys for /v1/*, one a line; without it the API binds loopback only"},
    {"served_model_name", &ServiceConfig::served_model_name, 256,
     "Model id the API reports and accepts (default: the model directory's name)"},
    {"ready_file", &ServiceConfig::ready_file, 4096,
     "Write {pid, worker, http_port} JSON here once serving"},
    {"synchronous", &ServiceConfig::synchronous, 16,
     "SQLite durability: normal | full (default normal)"},
    {"quantization", &ServiceConfig::quantization, 16,
     "cuda linear weights: auto (a checkpoint's FP8 / NVFP4 stay compressed) | none (all bf16) | "
     "fp8 | nvfp4 (also quantize bf16 weights on load) (default auto)"},
    {"metrics_host", &ServiceConfig::metrics_host, 64,
     "Address of the --metrics-port listener; beyond loopback it is readable by anyone who "
     "reaches it (logged as a warning) (default 127.0.0.1)"},
};

std::string flag_of(const char* key) {
  std::string f = std::string("--") + key;
  for (char& c : f)
    if (c == '_') c = '-';
  return f;
}

// The flag with its aliases: vLLM's --host and --port name the HTTP listener too.
std::string flag_names(const char* key) {
  const std::string f = flag_of(key);
  if (f == "--http-port") return f + ",--port";
  if (f == "--http-host") return f + ",--host";
  if (f == "--tp") return f + ",--tensor-parallel-size";
  return f;
}

}  // namespace

const char* batching_name(BatchingMode m) {
  return m == BatchingMode::Static ? "static" : "continuous";
}

void apply_config_json(const nlohmann::json& j, const std::string& source, ServiceConfig& cfg) {
  if (!j.is_object()) throw InputError(source + ": expected a JSON object");
  for (const auto& [key, value] : j.items()) {
    const std::string where = source + ": " + key;
    bool known = false;
    for (const IntKey& k : kIntKeys) {
      if (key != k.name) continue;
      known = true;
      if (!value.is_number_integer()) throw InputError(where + ": expected an integer");
      cfg.*k.field = value.get<int64_t>();
    }
    for (const SmallIntKey& k : kSmallIntKeys) {
      if (key != k.name) continue;
      known = true;
      if (!value.is_number_integer()) throw InputError(where + ": expected an integer");
      const auto v = value.get<int64_t>();
      if (v < k.lo || v > k.hi) {
        throw InputError(where + ": must be in [" + std::to_string(k.lo) + ", " +
                         std::to_string(k.hi) + "], got " + std::to_string(v));
      }
      cfg.*k.field = static_cast<int>(v);
    }
    for (const StrKey& k : kStrKeys) {
      if (key != k.name) continue;
      known = true;
      if (!value.is_string()) throw InputError(where + ": expected a string");
      cfg.*k.field = value.get<std::string>();
    }
    if (key == "batching") {
      known = true;
      if (!value.is_string()) throw InputError(where + ": expected a string");
      const auto s = value.get<std::string>();
      if (s == "continuous") {
        cfg.batching = BatchingMode::Continuous;
      } else if (s == "static") {
        cfg.batching = BatchingMode::Static;
      } else {
        throw InputError(where + ": expected continuous or static, got '" + s + "'");
      }
    }
    if (key == "gpu_memory_utilization") {
      known = true;
      if (!value.is_number()) throw InputError(where + ": expected a number");
      cfg.gpu_memory_utilization = value.get<double>();
    }
    if (key == "enable_expert_parallel" || key == "disable_custom_all_reduce") {
      known = true;
      if (!value.is_boolean()) throw InputError(where + ": expected true or false");
      (key == "enable_expert_parallel" ? cfg.enable_expert_parallel
                                       : cfg.disable_custom_all_reduce) = value.get<bool>();
    }
    if (!known) throw InputError(where + ": unknown key");
  }
}

void load_config_file(const std::filesystem::path& path, ServiceConfig& cfg) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError("config " + path.string() + ": " + ec.message());
  if (size > kMaxConfigBytes) throw InputError("config " + path.string() + ": larger than 1 MiB");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) throw InputError("config " + path.string() + ": not valid JSON");
  apply_config_json(j, "config " + path.string(), cfg);
}

void validate_config(const ServiceConfig& cfg) {
  for (const IntKey& k : kIntKeys) {
    const int64_t v = cfg.*k.field;
    if (v < k.lo || v > k.hi) {
      throw InputError(std::string(k.name) + ": must be in [" + std::to_string(k.lo) + ", " +
                       std::to_string(k.hi) + "], got " + std::to_string(v));
    }
  }
  for (const SmallIntKey& k : kSmallIntKeys) {
    const int v = cfg.*k.field;
    if (v < k.lo || v > k.hi) {
      throw InputError(std::string(k.name) + ": must be in [" + std::to_string(k.lo) + ", " +
                       std::to_string(k.hi) + "], got " + std::to_string(v));
    }
  }
  for (const StrKey& k : kStrKeys) {
    if ((cfg.*k.field).size() > k.max_bytes)
      throw InputError(std::string(k.name) + ": longer than " + std::to_string(k.max_bytes));
  }
  if (cfg.db.empty()) throw InputError("db: required");
  // InputError for a scheme that is not supported, before anything is created under its name;
  // a SQLite file or a postgresql:// URL (docs/postgres.md) is served alike.
  parse_store_location(cfg.db);
  if (cfg.model.empty()) throw InputError("model: required");
  if (cfg.backend != "cpu" && cfg.backend != "cuda")
    throw InputError("backend: expected cpu or cuda, got '" + cfg.backend + "'");
  parse_quantization(cfg.quantization);  // InputError naming the choices
  // NaN fails both comparisons, so it is refused too.
  if (!(cfg.gpu_memory_utilization > 0.0 && cfg.gpu_memory_utilization <= 1.0)) {
    throw InputError("gpu_memory_utilization: must be in (0, 1], got " +
                     std::to_string(cfg.gpu_memory_utilization));
  }
  // Every running sequence contributes one decode token per step, so a step must hold them all.
  if (cfg.max_num_batched_tokens < cfg.max_num_seqs) {
    throw InputError("max_num_batched_tokens (" + std::to_string(cfg.max_num_batched_tokens) +
                     ") must be >= max_num_seqs (" + std::to_string(cfg.max_num_seqs) + ")");
  }
  // Without keys anyone who reaches the port could use the API: loopback only then.
  if (!is_loopback_host(cfg.http_host) && cfg.api_key_file.empty()) {
    throw InputError("http_host: '" + cfg.http_host +
                     "' is not a loopback address; listening beyond loopback needs "
                     "--api-key-file (bearer keys for the API)");
  }
  RestartSchedule::parse(cfg.restart_at);  // InputError naming the field
  if (cfg.synchronous != "normal" && cfg.synchronous != "full")
    throw InputError("synchronous: expected normal or full, got '" + cfg.synchronous + "'");
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::vector<std::string> load_api_keys(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError("api_key_file " + path.string() + ": " + ec.message());
  if (size > kMaxConfigBytes)
    throw InputError("api_key_file " + path.string() + ": larger than 1 MiB");
  std::ifstream in(path);
  if (!in) throw InputError("api_key_file " + path.string() + ": cannot be read");
  std::vector<std::string> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    std::string key = line.substr(b, e - b + 1);
    for (unsigned char c : key) {
      if (c <= ' ' || c == 0x7f) {
        throw InputError("api_key_file " + path.string() + ": line " + std::to_string(n) +
                         ": a key may not hold whitespace or control characters");
      }
    }
    keys.push_back(std::move(key));
  }
  if (keys.empty()) throw InputError("api_key_file " + path.string() + ": holds no key");
  return keys;
}

nlohmann::json config_to_json(const ServiceConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const StrKey& k : kStrKeys) j[k.name] = cfg.*k.field;
  for (const IntKey& k : kIntKeys) j[k.name] = cfg.*k.field;
  for (const SmallIntKey& k : kSmallIntKeys) j[k.name] = cfg.*k.field;
  j["batching"] = batching_name(cfg.batching);
  j["gpu_memory_utilization"] = cfg.gpu_memory_utilization;
  j["enable_expert_parallel"] = cfg.enable_expert_parallel;
  j["disable_custom_all_reduce"] = cfg.disable_custom_all_reduce;
  return j;
}

/// Flag values as parsed, before merging with the file.
struct ServiceFlags {
  ServiceConfig values;     ///< flag targets
  std::string config_file;  ///< --config
  std::string batching = "continuous";
};

std::shared_ptr<ServiceFlags> add_service_flags(CLI::App& cmd) {
  auto f = std::make_shared<ServiceFlags>();
  cmd.add_option("--config", f->config_file, "JSON config file (keys as the flags, with _)");
  // A command that already has one of these options (serve's --db, shared with the ingress)
  // keeps its own; the caller copies that value into the config.
  for (const StrKey& k : kStrKeys) {
    if (cmd.get_option_no_throw(flag_of(k.name)) == nullptr)
      cmd.add_option(flag_names(k.name), f->values.*k.field, k.help);
  }
  for (const IntKey& k : kIntKeys) cmd.add_option(flag_of(k.name), f->values.*k.field, k.help);
  for (const SmallIntKey& k : kSmallIntKeys)
    cmd.add_option(flag_names(k.name), f->values.*k.field, k.help);
  cmd.add_option("--batching", f->batching, "continuous (default) | static");
  cmd.add_option("--gpu-memory-utilization", f->values.gpu_memory_utilization,
                 "cuda: share of the GPU's memory for weights, activations and KV (default 0.90)");
  cmd.add_flag("--enable-expert-parallel", f->values.enable_expert_parallel,
               "--tp > 1: whole experts per rank instead of a slice of every expert");
  cmd.add_flag("--disable-custom-all-reduce", f->values.disable_custom_all_reduce,
               "cuda, --tp > 1: NCCL for every all-reduce (default: small ones through the "
               "in-process peer-to-peer all-reduce, fused with the residual add + RMSNorm)");
  return f;
}

ServiceConfig finish_service_flags(const ServiceFlags& flags, CLI::App& cmd) {
  ServiceConfig cfg;
  if (!flags.config_file.empty()) load_config_file(flags.config_file, cfg);
  // Only flags actually given override the file; CLI11 counts occurrences per option.
  nlohmann::json given = nlohmann::json::object();
  const nlohmann::json all = config_to_json(flags.values);
  for (const auto& [key, value] : all.items()) {
    if (key == "batching") continue;
    if (cmd.count(flag_of(key.c_str())) > 0) given[key] = value;
  }
  if (cmd.count("--batching") > 0) given["batching"] = flags.batching;
  apply_config_json(given, "command line", cfg);
  if (cfg.db.empty()) cfg.db = default_db_path().string();
  validate_config(cfg);
  return cfg;
}

}  // namespace moebatch
