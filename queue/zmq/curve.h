// CURVE keys and the ZAP handler of the ingress.
//
// Keys live in files as Z85 text (40 characters; '#' comment lines and blank lines ignored): a
// secret key file holds one secret key (its public key is derived), a public key file one public
// key, and the server's allow list one client public key per line.
//
// No fail-open: libzmq lets every CURVE client in when no ZAP handler is bound in the context,
// so the ingress binds this handler BEFORE it binds any CURVE socket, and a handler that cannot
// bind (the endpoint is taken, CURVE is not built in) is an Error that stops the service from
// starting. The handler allows exactly the listed client keys and denies everything else.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

namespace moebatch::zmq_ingress {

/// A CURVE key pair, both halves as Z85 text (40 characters).
struct CurveKeyPair {
  std::string public_z85;  ///< shareable half
  std::string secret_z85;  ///< keep private
};

/// True when libzmq was built with CURVE (libsodium).
bool curve_available();

/// A fresh random key pair. Throws Error when CURVE is not available.
CurveKeyPair curve_generate_key_pair();
/// Reads a secret key file and derives the public half. Throws InputError naming the file, also
/// when group or others have any permission on it (mode & 077, as ssh does) and when it is a
/// public key file (labelled so by keygen, or named *.pub).
CurveKeyPair load_secret_key_file(const std::filesystem::path& path);
/// Reads a file holding one public key (Z85). Throws InputError naming the file, also for a file
/// keygen labelled as a secret key.
std::string load_public_key_file(const std::filesystem::path& path);
/// Reads an allow list: one Z85 public key per line. Returns the keys as 32-byte binary strings,
/// as ZAP delivers them. Throws InputError naming file and line; an empty list is an error.
std::set<std::string> load_allowed_keys_file(const std::filesystem::path& path);
/// Writes prefix.key (secret, mode 0600) and prefix.pub (0644), each created with
/// O_CREAT|O_EXCL|O_NOFOLLOW at its final mode. Refuses existing files and symlinks, dangling
/// ones included.
CurveKeyPair write_key_pair_files(const std::string& prefix);

/// ZAP (RFC 27) handler on inproc://zeromq.zap.01 of one context: allows CURVE clients whose
/// public key is in the allow list, denies all others. Its thread owns the socket; the counters
/// may be read from any thread.
class ZapHandler {
 public:
  /// Binds the ZAP endpoint (throws Error when it cannot: no fail-open) and starts the thread.
  ZapHandler(zmq::context_t& ctx, std::set<std::string> allowed_binary_keys);
  /// Stops and joins the thread.
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  /// Handshakes allowed so far.
  uint64_t allowed() const { return allowed_.load(); }
  /// Handshakes denied so far (unknown key, or not CURVE).
  uint64_t denied() const { return denied_.load(); }

 private:
  void run();
  void handle_one();

  zmq::socket_t socket_;
  std::set<std::string> allowed_keys_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> allowed_{0};
  std::atomic<uint64_t> denied_{0};
  std::thread thread_;
};

}  // namespace moebatch::zmq_ingress
