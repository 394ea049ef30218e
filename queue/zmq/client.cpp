#include "queue/zmq/client.h"

#include <spdlog/spdlog.h>

#include <random>
#include <thread>

#include "common/error.h"
#include "common/json_parse.h"
#include "queue/zmq/protocol.h"

namespace moebatch::zmq_ingress {

using nlohmann::json;

std::string random_hex_token() {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 4; ++i) {
    uint32_t v = rd();
    for (int k = 0; k < 8; ++k) {
      out.push_back(kHex[v & 15]);
      v >>= 4;
    }
  }
  return out;
}

LazyPirateClient::LazyPirateClient(ClientOptions options)
    : options_(std::move(options)), ctx_(1), id_prefix_(random_hex_token().substr(0, 8) + "-") {
  if (options_.endpoint.empty()) throw InputError("--endpoint: must not be empty");
  if (options_.attempts < 1) throw InputError("attempts must be at least 1");
  if (options_.timeout.count() <= 0) throw InputError("timeout must be positive");
  if (options_.curve && !curve_available()) {
    throw Error("CURVE requested but libzmq was built without it");
  }
}

LazyPirateClient::~LazyPirateClient() { socket_.reset(); }

void LazyPirateClient::connect() {
  socket_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::req);
  // LINGER 0: a request abandoned after a timeout must not keep the process alive.
  socket_->set(zmq::sockopt::linger, 0);
  socket_->set(zmq::sockopt::maxmsgsize, options_.max_reply_bytes);
  if (options_.curve) {
    socket_->set(zmq::sockopt::curve_serverkey, options_.curve->server_public_z85);
    socket_->set(zmq::sockopt::curve_publickey, options_.curve->client.public_z85);
    socket_->set(zmq::sockopt::curve_secretkey, options_.curve->client.secret_z85);
  }
  try {
    socket_->connect(options_.endpoint);
  } catch (const zmq::error_t& e) {
    socket_.reset();
    throw InputError("cannot connect to '" + options_.endpoint + "': " + e.what());
  }
}

json LazyPirateClient::call(json request) {
  if (!request.contains("id")) request["id"] = id_prefix_ + std::to_string(next_id_++);
  const std::string body = dump_json(request);
  auto backoff = options_.busy_backoff;
  std::string last_problem = "no reply";
  for (int attempt = 1; attempt <= options_.attempts; ++attempt) {
    if (!socket_) connect();
    socket_->send(zmq::buffer(body), zmq::send_flags::none);
    ++sends_;
    zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, options_.timeout);
    if (!(item.revents & ZMQ_POLLIN)) {
      // Lazy Pirate: a REQ socket cannot send twice in a row, and the old connection may be
      // wedged, so drop it and start over with a new socket.
      socket_.reset();
      last_problem = "no reply within " + std::to_string(options_.timeout.count()) + " ms";
      spdlog::warn("{} from {} (attempt {}/{})", last_problem, options_.endpoint, attempt,
                   options_.attempts);
      continue;
    }
    zmq::message_t msg;
    if (!socket_->recv(msg, zmq::recv_flags::none)) continue;
    json reply = parse_json_bounded(msg.to_string_view());
    if (reply.is_discarded() || !reply.is_object() || !reply.contains("ok") ||
        !reply["ok"].is_boolean()) {
      throw Error("malformed reply from " + options_.endpoint);
    }
    if (reply.value("id", json()) != request["id"]) {
      throw Error("reply from " + options_.endpoint + " answers another request");
    }
    const json* err = reply.contains("error") ? &reply["error"] : nullptr;
    const bool retryable = !reply["ok"].get<bool>() && err != nullptr && err->is_object() &&
                           err->value("retryable", false);
    if (retryable && attempt < options_.attempts) {
      last_problem = err->value("message", std::string("retryable error"));
      spdlog::warn("{}: {} (attempt {}/{}, retrying in {} ms)", options_.endpoint, last_problem,
                   attempt, options_.attempts, backoff.count());
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
      continue;
    }
    return reply;
  }
  throw Error("giving up on " + options_.endpoint + " after " + std::to_string(options_.attempts) +
              " attempt(s): " + last_problem);
}

std::vector<SubmitResult> LazyPirateClient::submit_jobs(std::vector<JobSpec> specs,
                                                        size_t per_message) {
  if (per_message == 0) throw InputError("per_message must be positive");
  const std::string key_prefix = "zmq-" + random_hex_token() + "-";
  std::vector<SubmitResult> out;
  out.reserve(specs.size());
  // A message ends at per_message jobs or before its body would pass max_request_bytes (the
  // ingress's limit), whichever comes first; one job alone over the limit is sent anyway and
  // gets the ingress's too_large answer.
  const size_t envelope = 128;  // {"v":1,"cmd":"submit","id":"...","jobs":[...]}
  size_t start = 0;
  while (start < specs.size()) {
    json jobs = json::array();
    size_t bytes = envelope;
    size_t end = start;
    while (end < specs.size() && end - start < per_message) {
      if (!specs[end].client_key) specs[end].client_key = key_prefix + std::to_string(end);
      json j = job_spec_to_json(specs[end]);
      const size_t size = dump_json(j).size() + 1;
      if (end > start && bytes + size > options_.max_request_bytes) break;
      bytes += size;
      jobs.push_back(std::move(j));
      ++end;
    }
    json reply = call({{"v", kProtocolVersion}, {"cmd", "submit"}, {"jobs", std::move(jobs)}});
    if (!reply["ok"].get<bool>()) {
      const json& e = reply["error"];
      std::string msg =
          e.is_object() ? e.value("message", std::string("rejected")) : std::string("rejected");
      // Jobs [0, start) are committed; say so, because the caller may want to resume.
      msg = "submit rejected: " + msg + " (" + std::to_string(start) + " job(s) acked before)";
      if (e.is_object() && e.value("retryable", false)) throw Error(msg);
      throw InputError(msg);
    }
    const json& acks = reply["jobs"];
    if (!acks.is_array() || acks.size() != end - start) {
      throw Error("malformed submit reply from " + options_.endpoint);
    }
    for (const json& a : acks) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("created") || !a["created"].is_boolean()) {
        throw Error("malformed submit reply from " + options_.endpoint);
      }
      out.push_back({a["id"].get<int64_t>(), a["created"].get<bool>()});
    }
    if (progress_) progress_(out.size());
    start = end;
  }
  return out;
}

json LazyPirateClient::call_batch(std::string_view cmd, const std::string& batch_id,
                                  const json& args) {
  json request = {{"v", kProtocolVersion}, {"cmd", std::string(cmd)}, {"batch_id", batch_id}};
  for (const auto& [k, v] : args.items()) request[k] = v;
  json reply = call(std::move(request));
  if (!reply["ok"].get<bool>()) {
    const json& e = reply["error"];
    const std::string msg =
        e.is_object() ? e.value("message", std::string("rejected")) : std::string("rejected");
    if (e.is_object() && e.value("retryable", false)) throw Error(std::string(cmd) + ": " + msg);
    throw InputError(std::string(cmd) + ": " + msg);
  }
  if (!reply.contains("batch")) throw Error("malformed batch reply from " + options_.endpoint);
  return reply;
}

ClientOptions client_options_from(const RemoteSubmitFlags& flags) {
  ClientOptions o;
  o.endpoint = flags.endpoint;
  o.timeout = std::chrono::milliseconds(flags.timeout_ms);
  o.attempts = flags.attempts;
  if (flags.curve_server_key.empty() != flags.curve_secret.empty()) {
    throw InputError("CURVE needs both --curve-server-key and --curve-secret");
  }
  if (!flags.curve_server_key.empty()) {
    o.curve = ClientCurve{load_public_key_file(flags.curve_server_key),
                          load_secret_key_file(flags.curve_secret)};
  }
  return o;
}

SubmitResult submit_remote(const RemoteSubmitFlags& flags, const JobSpec& spec) {
  LazyPirateClient client(client_options_from(flags));
  return client.submit_jobs({spec}).at(0);
}

}  // namespace moebatch::zmq_ingress
