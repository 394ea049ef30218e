#include "queue/zmq/ingress.h"

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <zmq_addon.hpp>

namespace moebatch::zmq_ingress {
namespace {

using nlohmann::json;

// Messages handled per socket per poll round, so a flood on one socket cannot starve the others
// (replies in particular: they free the producers that are waiting).
constexpr int kMaxPerRound = 256;
// Frames kept from one ROUTER message: routing id, optional empty delimiter, body. Further
// frames are still received (ZeroMQ delivers whole messages) but only counted.
constexpr size_t kMaxFrames = 3;
// Bytes a message may carry beyond its body: the routing id (libzmq caps it at 255 bytes) and
// the empty delimiter.
constexpr size_t kMaxEnvelopeBytes = 256;

constexpr const char* kRepliesEndpoint = "inproc://moebatch-ingress-replies";
constexpr const char* kNoticesEndpoint = "inproc://moebatch-ingress-notices";
constexpr const char* kControlEndpoint = "inproc://moebatch-ingress-control";

void apply_curve(zmq::socket_t& s, const CurveServerConfig& c) {
  s.set(zmq::sockopt::curve_server, 1);
  s.set(zmq::sockopt::curve_secretkey, c.server.secret_z85);
  // A non-empty domain makes libzmq consult the ZAP handler for every handshake.
  s.set(zmq::sockopt::zap_domain, "moebatch");
}

void bind_or_throw(zmq::socket_t& s, const std::string& endpoint, const char* what) {
  try {
    s.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw Error(std::string("cannot bind the ") + what + " socket to '" + endpoint +
                "': " + e.what());
  }
}

}  // namespace

std::string notice_topic(const std::optional<std::string>& batch_id) {
  std::string t = "batch/" + batch_id.value_or("");
  t.push_back('\0');
  return t;
}

std::string notice_body(const CompletionNotice& n) {
  auto opt = [](const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); };
  return dump_json({{"v", kProtocolVersion},
                    {"event", "job_final"},
                    {"job_id", n.job_id},
                    {"key", opt(n.key)},
                    {"batch_id", opt(n.batch_id)},
                    {"state", job_state_to_string(n.state)},
                    {"error", opt(n.error)}});
}

Ingress::Ingress(IngressOptions options)
    : options_(std::move(options)),
      ctx_(1),
      router_(ctx_, zmq::socket_type::router),
      pub_(ctx_, zmq::socket_type::pub),
      replies_in_(ctx_, zmq::socket_type::pull),
      notices_in_(ctx_, zmq::socket_type::pull),
      control_in_(ctx_, zmq::socket_type::pair),
      notices_out_(ctx_, zmq::socket_type::push),
      control_out_(ctx_, zmq::socket_type::pair) {
  if (!options_.max_message_bytes)
    options_.max_message_bytes = default_max_message_bytes(options_.limits);
  if (*options_.max_message_bytes <= static_cast<int64_t>(options_.limits.max_request_bytes)) {
    throw InputError("max_message_bytes must exceed max_request_bytes, so that oversize "
                     "requests get a too_large reply rather than a dropped connection");
  }
  if (options_.limits.max_jobs_per_message == 0 || options_.worker.capacity == 0) {
    throw InputError("max_jobs_per_message and the store queue capacity must be positive");
  }
  // The ZAP handler is bound before any CURVE socket exists (see curve.h: no fail-open).
  if (options_.curve) zap_ = std::make_unique<ZapHandler>(ctx_, options_.curve->allowed_clients);

  for (zmq::socket_t* s : {&router_, &pub_, &replies_in_, &notices_in_, &control_in_,
                           &notices_out_, &control_out_}) {
    s->set(zmq::sockopt::linger, 0);
  }
  replies_in_.set(zmq::sockopt::rcvhwm, 0);
  replies_in_.bind(kRepliesEndpoint);
  notices_in_.set(zmq::sockopt::rcvhwm, options_.notice_hwm);
  notices_in_.bind(kNoticesEndpoint);
  notices_out_.set(zmq::sockopt::sndhwm, options_.notice_hwm);
  notices_out_.connect(kNoticesEndpoint);
  control_in_.bind(kControlEndpoint);
  control_out_.connect(kControlEndpoint);

  router_.set(zmq::sockopt::router_mandatory, 1);
  router_.set(zmq::sockopt::maxmsgsize, *options_.max_message_bytes);
  router_.set(zmq::sockopt::rcvhwm, options_.rcv_hwm);
  router_.set(zmq::sockopt::sndhwm, options_.snd_hwm);
  // Replies already committed deserve a moment to leave on shutdown.
  router_.set(zmq::sockopt::linger, 1000);
  if (options_.curve) apply_curve(router_, *options_.curve);
  bind_or_throw(router_, options_.bind, "ROUTER");
  router_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  if (options_.pub) {
    pub_.set(zmq::sockopt::sndhwm, options_.pub_hwm);
    pub_.set(zmq::sockopt::linger, 1000);
    if (options_.curve) apply_curve(pub_, *options_.curve);
    bind_or_throw(pub_, *options_.pub, "PUB");
    pub_endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
  }

  // Opened here, on the caller's thread, so a bad database stops start-up with its error;
  // the store is then used only by the store thread.
  auto store = std::make_unique<JobStore>(options_.store);
  worker_ = std::make_unique<StoreWorker>(ctx_, kRepliesEndpoint, std::move(store),
                                          options_.worker, counters_);
  thread_ = std::thread([this] { run(); });
}

Ingress::~Ingress() { stop(); }

void Ingress::stop() {
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    if (stopped_) return;
    stopped_ = true;
    control_out_.send(zmq::str_buffer("stop"), zmq::send_flags::none);
  }
  if (thread_.joinable()) thread_.join();
  worker_.reset();
  // Every socket is closed here (after the threads that used them are joined), so the context
  // can terminate; the ZAP handler goes last because the sockets may still be handshaking.
  router_.close();
  pub_.close();
  replies_in_.close();
  notices_in_.close();
  control_in_.close();
  {
    std::lock_guard<std::mutex> lock(notices_mu_);
    notices_out_.close();
  }
  control_out_.close();
  zap_.reset();
}

bool Ingress::publish_completion(const CompletionNotice& notice) {
  if (!options_.pub) return true;
  const std::string topic = notice_topic(notice.batch_id);
  const std::string body = notice_body(notice);
  std::lock_guard<std::mutex> lock(notices_mu_);
  if (!notices_out_) return false;  // stopped
  // A ZeroMQ multipart message is atomic: once the first frame is queued the last one is too.
  if (!notices_out_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    counters_.notices_refused.fetch_add(1);
    return false;
  }
  notices_out_.send(zmq::buffer(body), zmq::send_flags::none);
  return true;
}

void Ingress::run() {
  std::array<zmq::pollitem_t, 4> items = {{
      {static_cast<void*>(control_in_), 0, ZMQ_POLLIN, 0},
      {static_cast<void*>(replies_in_), 0, ZMQ_POLLIN, 0},
      {static_cast<void*>(notices_in_), 0, ZMQ_POLLIN, 0},
      {static_cast<void*>(router_), 0, ZMQ_POLLIN, 0},
  }};
  bool draining = false, ended = false;
  while (!ended) {
    // While draining, the ROUTER is no longer polled: nothing new is accepted.
    const int n = draining ? 3 : 4;
    try {
      zmq::poll(items.data(), n, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (!draining && (items[0].revents & ZMQ_POLLIN)) {
      zmq::message_t m;
      (void)control_in_.recv(m, zmq::recv_flags::dontwait);
      draining = true;
      worker_->close();
    }
    if (items[1].revents & ZMQ_POLLIN) forward_replies(&ended);
    if (items[2].revents & ZMQ_POLLIN) forward_notices();
    if (!draining && (items[3].revents & ZMQ_POLLIN)) {
      for (int k = 0; k < kMaxPerRound; ++k) {
        if (!(router_.get(zmq::sockopt::events) & ZMQ_POLLIN)) break;
        handle_request();
      }
    }
  }
  forward_notices();
}

void Ingress::handle_request() {
  // Frames and bytes are counted as they come off the socket; past kMaxFrames frames or the
  // byte budget nothing more is kept (the body frames already kept are dropped too), and the
  // message is answered without being parsed. libzmq itself assembles a multipart message in
  // full before the first frame is readable, so what bounds the bytes a peer can make it hold
  // is ZMQ_MAXMSGSIZE per frame, and CURVE for who may send at all (docs/zmq.md, Limits).
  const size_t budget = options_.limits.max_request_bytes + kMaxEnvelopeBytes;
  std::vector<zmq::message_t> frames;
  size_t total = 0, bytes = 0;
  bool oversize = false;
  for (bool more = true; more;) {
    zmq::message_t part;
    if (!router_.recv(part, zmq::recv_flags::dontwait)) return;
    more = part.more();
    ++total;
    bytes += part.size();
    if (!oversize && bytes > budget) {
      oversize = true;
      // Keep the routing id and an empty delimiter: they address the reply.
      while (frames.size() > 1 && frames.back().size() > 0) frames.pop_back();
    }
    if (frames.empty() || (!oversize && frames.size() < kMaxFrames)) {
      frames.push_back(std::move(part));
    }
  }
  // The envelope decides how to answer: REQ peers put an empty delimiter before the body.
  std::vector<std::string> envelope = {frames[0].to_string()};
  const bool req_style = frames.size() >= 2 && frames[1].size() == 0;
  if (req_style) envelope.emplace_back();
  const size_t expected = req_style ? 3 : 2;
  if (oversize) {
    send_error(envelope, nullptr,
               ProtocolError{std::string(error_code::kTooLarge),
                             // Counted as the peer sent it: without the ROUTER's routing id.
                             "message of " + std::to_string(total - 1) + " frame(s) and " +
                                 std::to_string(bytes - frames[0].size()) +
                                 " bytes exceeds the limit of " +
                                 std::to_string(budget - kMaxEnvelopeBytes) + " bytes",
                             std::nullopt, false});
    return;
  }
  if (total != expected) {
    send_error(envelope, nullptr,
               ProtocolError{std::string(error_code::kBadFrames),
                             "expected one body frame after the envelope, got " +
                                 std::to_string(total > envelope.size() ? total - envelope.size()
                                                                         : 0),
                             std::nullopt, false});
    return;
  }
  const zmq::message_t& body = frames[expected - 1];
  json id = nullptr;
  RoutedRequest item;
  try {
    item.request = parse_request(body.to_string_view(), options_.limits, &id);
  } catch (const ProtocolException& e) {
    send_error(envelope, id, e.error());
    return;
  }
  item.envelope = std::move(envelope);
  if (!worker_->try_push(item)) {
    send_error(item.envelope, item.request.id,
               ProtocolError{std::string(error_code::kBusy),
                             "the ingress queue is full; retry later", std::nullopt, true});
    return;
  }
  counters_.requests.fetch_add(1);
}

void Ingress::send_error(const std::vector<std::string>& envelope, const json& id,
                         const ProtocolError& err) {
  counters_.errors.fetch_add(1);
  if (err.code == error_code::kBusy) counters_.busy.fetch_add(1);
  std::vector<zmq::message_t> frames;
  for (const std::string& f : envelope) frames.emplace_back(f.data(), f.size());
  const std::string body = error_reply(id, err);
  frames.emplace_back(body.data(), body.size());
  send_to_router(frames);
}

void Ingress::send_to_router(std::vector<zmq::message_t>& frames) {
  // ROUTER_MANDATORY makes an unknown peer an error (EHOSTUNREACH) and a full peer pipe EAGAIN
  // with dontwait, instead of a silent drop. Either way the reply is lost to that peer; the
  // work it describes is committed, and the producer's retry with the same key gets the same
  // ids, so counting and logging is the right response, and blocking the thread is not.
  try {
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto flags = i + 1 < frames.size()
                             ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                             : zmq::send_flags::dontwait;
      if (!router_.send(frames[i], flags)) {
        counters_.undeliverable.fetch_add(1);
        spdlog::warn("ingress: reply not delivered: the peer's queue is full (snd_hwm)");
        return;
      }
    }
  } catch (const zmq::error_t& e) {
    counters_.undeliverable.fetch_add(1);
    spdlog::warn("ingress: reply not delivered: {}", e.what());
  }
}

void Ingress::forward_replies(bool* ended) {
  for (int k = 0; k < kMaxPerRound; ++k) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(replies_in_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      return;
    }
    if (frames.size() == 1) {  // the store thread's end marker (see store_worker.h)
      *ended = true;
      return;
    }
    send_to_router(frames);
  }
}

void Ingress::forward_notices() {
  for (int k = 0; k < kMaxPerRound; ++k) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(notices_in_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      return;
    }
    if (frames.size() != 2) continue;  // only publish_completion writes here: always 2 frames
    if (pub_endpoint_.empty()) continue;
    pub_.send(frames[0], zmq::send_flags::sndmore);
    pub_.send(frames[1], zmq::send_flags::none);
    counters_.notices.fetch_add(1);
  }
}

}  // namespace moebatch::zmq_ingress
