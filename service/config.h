// The service's configuration: defaults, a JSON config file, and command-line flags on top (a
// flag given on the command line wins over the file). Everything is validated with bounds
// before the service starts; the effective configuration is printed in the start log.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moebatch {

/// How the engine thread forms batches.
enum class BatchingMode {
  Continuous,  ///< a slot freed by a finished sequence is refilled at the next step (default)
  Static,      ///< wait for a whole batch, run it to the end, then take the next one
};

/// Every knob of `moebatch serve`. Field names are the JSON keys (snake_case) and, with dashes,
/// the flag names.
struct ServiceConfig {
  std::string db;                         ///< job database (required)
  std::string model;                      ///< checkpoint directory (required)
  std::string tokenizer;                  ///< tokenizer directory; empty = the model directory
  std::string backend = "cpu";            ///< cpu | cuda
  double gpu_memory_utilization = 0.90;   ///< cuda: share of the GPU's memory this process uses
  int tp = 1;                             ///< tensor-parallel ranks
  bool enable_expert_parallel = false;    ///< tp > 1: whole experts per rank
  bool disable_custom_all_reduce = false; ///< cuda, tp > 1: NCCL for every all-reduce
  int64_t collective_timeout_s = 120;     ///< cuda, tp > 1: a stuck collective fails the engine
  std::string quantization = "auto";      ///< cuda: auto | none | fp8 | nvfp4
  int threads = 0;                        ///< CPU compute threads; 0 = all cores
  int64_t kv_cache_mb = 0;                ///< KV cache MiB over all ranks; 0: cpu 256, cuda no cap
  int64_t max_num_seqs = 64;              ///< batch slots (vLLM --max-num-seqs)
  int64_t max_num_batched_tokens = 4096;  ///< tokens per step (vLLM --max-num-batched-tokens)
  BatchingMode batching = BatchingMode::Continuous;  ///< see BatchingMode
  int64_t static_batch_wait_ms = 200;   ///< static mode: longest wait for a batch to fill
  int64_t max_model_len = 0;            ///< prompt + max_tokens cap; 0 = the model's context
  int64_t max_prompt_tokens = 32768;    ///< rendered prompt length cap
  int64_t lease_s = 60;                 ///< job lease; renewed every lease/3 while running
  int64_t poll_ms = 50;                 ///< data_version poll period (external inserts)
  int64_t drain_timeout_s = 60;         ///< maintenance: wait this long for in-flight work
  int64_t shutdown_timeout_s = 30;      ///< SIGTERM: wait this long, then give jobs back
  std::string restart_at;               ///< "HH:MM" or 5-field cron; empty = no nightly restart
  int64_t warmup_seqs = 4;              ///< sequences in the warmup batch after a (re)build
  std::string http_host = "127.0.0.1";  ///< HTTP address; beyond loopback only with api_key_file
  int http_port = 9464;                 ///< HTTP port (health, metrics, API); 0 = any; -1 = off
  int64_t http_max_connections = 256;   ///< open HTTP connections at most; beyond: 503
  int64_t http_max_connections_per_address = 128;  ///< from one non-loopback address (IPv6: /64); beyond: 503
  int64_t http_min_send_kib_s = 64;     ///< a reply of known length averages this, past 60 s of grace
  std::string api_key_file;             ///< bearer keys for /v1, one a line; empty = no auth
  std::string served_model_name;        ///< model id in the API; empty = model dir's name
  int64_t api_priority = 1000;          ///< queue priority of API requests (batch work: 0)
  int64_t api_max_pending = 256;        ///< API requests open at once; beyond: 429
  int64_t batch_output_max_mb = 512;    ///< a Batch API batch's output + error files at most
  int64_t health_stall_s = 60;          ///< /health fails when busy and no step for this long
  std::string ready_file;               ///< written (JSON: pid, worker, http_port) once serving
  std::string synchronous = "normal";   ///< SQLite durability: normal | full

  /// Writes refused for a lock held this long (ms): /health reports the store unwritable.
  int64_t store_busy_timeout_ms = 5000;
  int64_t log_stats_interval_s = 10;       ///< throughput log line period; 0 = off
  std::string metrics_host = "127.0.0.1";  ///< address of the /metrics + /health listener
  int metrics_port = -1;                   ///< its port; 0 = any; -1 = off (HTTP port only)
};

/// Reads a JSON object of ServiceConfig keys onto `cfg` (unknown keys are errors). InputError
/// names the file and key.
void load_config_file(const std::filesystem::path& path, ServiceConfig& cfg);

/// Applies a parsed JSON object of ServiceConfig keys onto `cfg`; `source` names it in errors.
void apply_config_json(const nlohmann::json& j, const std::string& source, ServiceConfig& cfg);

/// Checks every bound; InputError naming the key on the first violation.
void validate_config(const ServiceConfig& cfg);

/// The configuration as JSON (for the start log and the ready file).
nlohmann::json config_to_json(const ServiceConfig& cfg);

/// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);

/// The keys of an API key file: one a line, blank lines and '#' comments skipped, surrounding
/// whitespace trimmed. InputError when it cannot be read, holds no key, or a key has inner
/// whitespace or control characters.
std::vector<std::string> load_api_keys(const std::filesystem::path& path);

/// "continuous" | "static".
const char* batching_name(BatchingMode m);

/// Registers the service flags on `cmd`, plus --config FILE. After parsing, call
/// finish_service_flags to merge file and flags into the effective config.
struct ServiceFlags;
std::shared_ptr<ServiceFlags> add_service_flags(CLI::App& cmd);
/// The effective config: defaults, then --config, then flags given on the command line;
/// validated.
ServiceConfig finish_service_flags(const ServiceFlags& flags, CLI::App& cmd);

}  // namespace moebatch
