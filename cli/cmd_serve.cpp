// CLI commands `serve` (the long-running daemon) and `keygen` (CURVE key files).
//
// `serve` runs the full service (service/service.h: dispatcher, engine thread, result writer,
// maintenance, health/metrics and the OpenAI-compatible API on the HTTP port, docs/openai_api.md)
// with the ZeroMQ ingress in front of the same job store: a
// committed ZMQ submit wakes the dispatcher, and every final job is announced on the PUB socket.
// SIGINT/SIGTERM drain the service, then stop the ingress. `serve --no-engine` runs the ingress
// alone (queue-only daemon). When ready it prints one line on stdout:
// {"router": "<endpoint>", "pub": "<endpoint>"} (plus "http_port" with the engine).
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "common/error.h"
#include "common/paths.h"
#include "queue/store_url.h"
#include "queue/zmq/curve.h"
#include "queue/zmq/ingress.h"
#include "service/config.h"
#include "service/service.h"

namespace moebatch::cli {
namespace {

namespace zi = moebatch::zmq_ingress;

/// Options of `serve`.
struct ServeFlags {
  bool no_engine = false;
  std::string db, bind = "tcp://127.0.0.1:5555", pub;
  std::string curve_secret, curve_clients;
  size_t max_jobs_per_message = 1000;
  size_t max_request_bytes = 4u << 20;
  std::optional<int64_t> max_message_bytes;  // unset: zi::default_max_message_bytes
  size_t queue_capacity = 256;
  int hwm = 1000;
  bool full_sync = false;
  std::string test_crash;
};

// A misspelled endpoint is a usage error (exit 2), found before the model is loaded; an
// address that cannot be bound (in use, not ours) is found by the bind itself.
void check_endpoint(const char* flag, const std::string& endpoint) {
  for (const char* transport : {"tcp://", "ipc://", "inproc://"})
    if (endpoint.rfind(transport, 0) == 0 && endpoint.size() > std::string(transport).size())
      return;
  throw InputError(std::string(flag) + ": '" + endpoint +
                   "' is not a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH or inproc://NAME)");
}

zi::IngressOptions ingress_options(const ServeFlags& f) {
  check_endpoint("--bind", f.bind);
  if (!f.pub.empty()) check_endpoint("--pub", f.pub);
  zi::IngressOptions o;
  o.bind = f.bind;
  if (!f.pub.empty()) o.pub = f.pub;
  std::filesystem::path db = f.db.empty() ? default_db_path() : std::filesystem::path(f.db);
  prepare_store_location(db.string());  // InputError for an unsupported scheme
  o.store.path = db;
  o.store.synchronous = f.full_sync ? Synchronous::Full : Synchronous::Normal;
  o.limits.max_jobs_per_message = f.max_jobs_per_message;
  o.limits.max_request_bytes = f.max_request_bytes;
  o.max_message_bytes = f.max_message_bytes;
  o.rcv_hwm = f.hwm;
  o.snd_hwm = f.hwm;
  o.worker.capacity = f.queue_capacity;
  if (f.curve_secret.empty() != f.curve_clients.empty()) {
    throw InputError("CURVE needs both --curve-secret and --curve-clients");
  }
  if (!f.curve_secret.empty()) {
    o.curve = zi::CurveServerConfig{zi::load_secret_key_file(f.curve_secret),
                                    zi::load_allowed_keys_file(f.curve_clients)};
  }
  if (f.test_crash == "before-commit") {
    o.worker.crash_point = zi::CrashPoint::BeforeCommit;
  } else if (f.test_crash == "after-commit") {
    o.worker.crash_point = zi::CrashPoint::AfterCommit;
  } else if (!f.test_crash.empty()) {
    throw InputError("--test-crash: expected before-commit or after-commit");
  }
  return o;
}

// Every connection (HTTP, ZeroMQ) holds a descriptor, and distributions still default the soft
// limit to 1024 while allowing far more: take what the hard limit (systemd's LimitNOFILE)
// allows, as nginx and Go programs do, so a connection flood meets the per-listener caps before
// the process runs out of descriptors.
void raise_descriptor_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t before = rl.rlim_cur;
  rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, rlim_t{1} << 20);  // the kernel's default nr_open
  if (rl.rlim_cur > before && setrlimit(RLIMIT_NOFILE, &rl) == 0) {
    spdlog::info("serve: descriptor limit raised from {} to {}", before, rl.rlim_cur);
  }
}

// The full service. The Service owns its signal handling; the ingress is stopped after the
// service has drained, so producers get acks until the very end.
void run_full_service(const ServeFlags& f, const ServiceFlags& sf, CLI::App& cmd) {
  zi::IngressOptions io_opts = ingress_options(f);
  ServiceConfig cfg = finish_service_flags(sf, cmd);
  cfg.db = io_opts.store.path.string();
  if (f.full_sync) cfg.synchronous = "full";
  validate_config(cfg);
  // The two objects refer to each other (submit wakes the service, completion notices go out
  // through the ingress); each reaches the other through this holder, set once both exist.
  struct Links {
    std::atomic<Service*> service{nullptr};
    std::atomic<zi::Ingress*> ingress{nullptr};
  };
  auto links = std::make_shared<Links>();
  ServiceHooks hooks;
  hooks.on_final = [links](const FinalNotice& n) {
    zi::Ingress* in = links->ingress.load();
    if (!in) return;
    zi::CompletionNotice c;
    c.job_id = n.job_id;
    c.key = n.client_key;
    c.batch_id = n.batch_id;
    c.state = n.state;
    c.error = n.error;
    in->publish_completion(c);
  };
  Service service(cfg, hooks);
  io_opts.worker.on_committed = [links](size_t) {
    if (Service* s = links->service.load()) s->wake();
  };
  zi::Ingress ingress(std::move(io_opts));
  links->service = &service;
  links->ingress = &ingress;
  std::cout << nlohmann::json({{"router", ingress.router_endpoint()},
                               {"pub", ingress.pub_endpoint()},
                               {"http_port", service.http_port()}})
                   .dump()
            << std::endl;
  const int code = service.run();
  links->ingress = nullptr;
  ingress.stop();
  if (code != 0) throw CLI::RuntimeError(code);
}

void run_serve(const ServeFlags& f, const ServiceFlags& sf, CLI::App& cmd) {
  raise_descriptor_limit();
  if (!f.no_engine) {
    run_full_service(f, sf, cmd);
    return;
  }
  zi::Ingress ingress(ingress_options(f));
  boost::asio::io_context io;
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;  // operation_aborted: the set was cancelled, nothing to do
    spdlog::info("serve: signal {}; stopping", sig);
    ingress.stop();
  });
  std::cout << nlohmann::json(
                   {{"router", ingress.router_endpoint()}, {"pub", ingress.pub_endpoint()}})
                   .dump()
            << std::endl;
  spdlog::info("serve: ingress on {} (notices on {}), queue-only", ingress.router_endpoint(),
               ingress.pub_endpoint().empty() ? "-" : ingress.pub_endpoint());
  io.run();
  const auto& c = ingress.counters();
  spdlog::info("serve: stopped; {} request(s), {} job(s) created, {} busy, {} undeliverable",
               c.requests.load(), c.jobs_created.load(), c.busy.load(), c.undeliverable.load());
}

}  // namespace

void register_serve_commands(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  auto* serve = app.add_subcommand(
      "serve", "Run the service: engine, dispatcher and ZeroMQ ingress over the job queue");
  serve->add_flag("--no-engine", f->no_engine, "Queue only: accept and answer, run no jobs");
  serve->add_option("--db", f->db, "Job database (default $MOEBATCH_DB or the user data dir)");
  serve->add_option("--bind", f->bind, "ROUTER endpoint (default tcp://127.0.0.1:5555)");
  serve->add_option("--pub", f->pub, "PUB endpoint for completion notices (default: none)");
  serve->add_option("--curve-secret", f->curve_secret, "Server CURVE secret key file (Z85)");
  serve->add_option("--curve-clients", f->curve_clients,
                    "Allowed client public keys, one Z85 key per line");
  serve->add_option("--max-jobs-per-message", f->max_jobs_per_message,
                    "Jobs in one submit (default 1000)");
  serve->add_option("--max-request-bytes", f->max_request_bytes,
                    "Largest request answered (default 4 MiB); bigger gets too_large");
  serve->add_option("--max-message-bytes", f->max_message_bytes,
                    "ZMQ_MAXMSGSIZE: a bigger frame drops the connection (default "
                    "--max-request-bytes + 64 KiB)");
  serve->add_option("--queue-capacity", f->queue_capacity,
                    "Requests waiting for the store before replying busy (default 256)");
  serve->add_option("--hwm", f->hwm, "ROUTER send/receive high-water marks (default 1000)");
  serve->add_flag("--full-sync", f->full_sync, "SQLite synchronous=FULL (power-loss safe)");
  // Test hook (docs/zmq.md): exit abruptly before or after the first submit commit.
  serve->add_option("--test-crash", f->test_crash, "")->group("");
  // Service flags (model, batching, schedule, health port, --config FILE, ...): see
  // service/config.h; --db is shared with the ingress.
  auto sf = add_service_flags(*serve);
  serve->callback([f, sf, serve] { run_serve(*f, *sf, *serve); });

  auto prefix = std::make_shared<std::string>();
  auto* keygen = app.add_subcommand("keygen", "Write a CURVE key pair: PREFIX.key and PREFIX.pub");
  keygen->add_option("prefix", *prefix, "Path prefix of the two files")->required();
  keygen->callback([prefix] {
    zi::CurveKeyPair kp = zi::write_key_pair_files(*prefix);
    std::cout << "wrote " << *prefix << ".key (secret) and " << *prefix << ".pub: " << kp.public_z85
              << "\n";
  });
}

}  // namespace moebatch::cli
