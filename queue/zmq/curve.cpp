#include "queue/zmq/curve.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>
#include <zmq_addon.hpp>

#include "common/error.h"

namespace moebatch::zmq_ingress {
namespace {

// Key files are tiny; anything bigger is not a key file and is refused before reading it.
constexpr std::uintmax_t kMaxKeyFileBytes = 1 << 20;
constexpr size_t kMaxAllowedKeys = 100000;
constexpr size_t kZ85KeyChars = 40;
constexpr size_t kBinaryKeyBytes = 32;

/// A key file's text, read once through one descriptor so the checks and the contents are of
/// the same file. Non-regular files and files over kMaxKeyFileBytes are refused; *mode gets the
/// permission bits.
std::string read_key_file(const std::filesystem::path& path, mode_t* mode) {
  // O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    throw InputError("cannot read key file '" + path.string() + "': " + std::strerror(errno));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw InputError("key file '" + path.string() + "' is not a regular file");
  }
  if (static_cast<std::uintmax_t>(st.st_size) > kMaxKeyFileBytes) {
    throw InputError("key file '" + path.string() + "' is larger than 1 MiB");
  }
  *mode = st.st_mode & 07777;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw InputError("cannot read key file '" + path.string() + "': " + std::strerror(errno));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxKeyFileBytes) {
      throw InputError("key file '" + path.string() + "' is larger than 1 MiB");
    }
  }
  return text;
}

/// A key file's lines.
struct KeyLines {
  std::vector<std::pair<size_t, std::string>> keys;  ///< non-blank, non-comment, trimmed
  std::vector<std::string> comments;                 ///< '#' lines, as written
  mode_t mode = 0;                                   ///< permission bits of the file
};

KeyLines read_key_lines(const std::filesystem::path& path) {
  KeyLines out;
  std::istringstream in(read_key_file(path, &out.mode));
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    if (line[b] == '#') {
      out.comments.push_back(line.substr(b));
      continue;
    }
    const auto e = line.find_last_not_of(" \t\r");
    out.keys.emplace_back(n, line.substr(b, e - b + 1));
  }
  return out;
}

// keygen labels its files ("# moebatch CURVE secret key (Z85)" / "... public key ..."): a file
// labelled as the other half is the wrong file, whatever its name.
bool labelled(const KeyLines& lines, std::string_view what) {
  for (const std::string& c : lines.comments) {
    if (c.find(what) != std::string::npos) return true;
  }
  return false;
}

/// Decodes a Z85 key to 32 bytes; throws InputError naming where it came from.
std::string decode_key(const std::string& z85, const std::string& where) {
  if (z85.size() != kZ85KeyChars) {
    throw InputError(where + ": a Z85 key has 40 characters, got " + std::to_string(z85.size()));
  }
  uint8_t bin[kBinaryKeyBytes];
  if (zmq_z85_decode(bin, z85.c_str()) == nullptr) {
    throw InputError(where + ": not valid Z85 text");
  }
  return std::string(reinterpret_cast<const char*>(bin), kBinaryKeyBytes);
}

std::string single_key(const std::filesystem::path& path, const KeyLines& lines) {
  if (lines.keys.size() != 1) {
    throw InputError("key file '" + path.string() + "' must hold exactly one key, found " +
                     std::to_string(lines.keys.size()));
  }
  decode_key(lines.keys[0].second, path.string() + ":" + std::to_string(lines.keys[0].first));
  return lines.keys[0].second;
}

// O_CREAT|O_EXCL creates the file with its final mode in one step: it never exists with looser
// permissions, and neither an existing file nor a symlink (dangling or not) at path is followed.
void write_new_file(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) throw InputError("'" + path + "' exists; not overwriting");
    throw InputError("cannot create '" + path + "': " + std::strerror(errno));
  }
  // The umask may have taken bits away from mode; a public file is readable by design, a secret
  // one must not gain any, so set exactly mode on the descriptor.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::fsync(fd) == 0 && ok;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    ::unlink(path.c_str());
    throw Error("writing '" + path + "' failed: " + std::strerror(errno));
  }
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

CurveKeyPair curve_generate_key_pair() {
  MB_CHECK(curve_available(), "libzmq was built without CURVE");
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  MB_CHECK(zmq_curve_keypair(pub, sec) == 0, "zmq_curve_keypair failed");
  return {pub, sec};
}

CurveKeyPair load_secret_key_file(const std::filesystem::path& path) {
  const KeyLines lines = read_key_lines(path);
  // As ssh does with private keys: a secret others can read (or write) is not used.
  if ((lines.mode & 077) != 0) {
    char mode[16];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(lines.mode));
    throw InputError("secret key file '" + path.string() + "' has mode " + mode +
                     ": other users may read it; chmod 600 it");
  }
  if (labelled(lines, "public key") || path.extension() == ".pub") {
    throw InputError("key file '" + path.string() +
                     "' holds a public key; give the secret key file (PREFIX.key) here");
  }
  CurveKeyPair kp;
  kp.secret_z85 = single_key(path, lines);
  char pub[kZ85KeyChars + 1];
  MB_CHECK(curve_available(), "libzmq was built without CURVE");
  if (zmq_curve_public(pub, kp.secret_z85.c_str()) != 0) {
    throw InputError("key file '" + path.string() + "': cannot derive a public key");
  }
  kp.public_z85 = pub;
  return kp;
}

std::string load_public_key_file(const std::filesystem::path& path) {
  const KeyLines lines = read_key_lines(path);
  if (labelled(lines, "secret key")) {
    throw InputError("key file '" + path.string() +
                     "' holds a secret key; give the public key file (PREFIX.pub) here");
  }
  return single_key(path, lines);
}

std::set<std::string> load_allowed_keys_file(const std::filesystem::path& path) {
  std::set<std::string> keys;
  const KeyLines lines = read_key_lines(path);
  if (labelled(lines, "secret key")) {
    throw InputError("allow list '" + path.string() + "' holds a secret key; list public keys");
  }
  for (const auto& [line_no, text] : lines.keys) {
    if (keys.size() >= kMaxAllowedKeys) {
      throw InputError("'" + path.string() + "' holds more than 100000 keys");
    }
    keys.insert(decode_key(text, path.string() + ":" + std::to_string(line_no)));
  }
  if (keys.empty()) throw InputError("allow list '" + path.string() + "' holds no keys");
  return keys;
}

CurveKeyPair write_key_pair_files(const std::string& prefix) {
  CurveKeyPair kp = curve_generate_key_pair();
  write_new_file(prefix + ".key", "# moebatch CURVE secret key (Z85)\n" + kp.secret_z85 + "\n",
                 0600);
  try {
    write_new_file(prefix + ".pub", "# moebatch CURVE public key (Z85)\n" + kp.public_z85 + "\n",
                   0644);
  } catch (const Error&) {
    // A secret whose public half was never written is of no use: leave no half pair behind.
    ::unlink((prefix + ".key").c_str());
    throw;
  }
  return kp;
}

ZapHandler::ZapHandler(zmq::context_t& ctx, std::set<std::string> allowed_binary_keys)
    : socket_(ctx, zmq::socket_type::rep), allowed_keys_(std::move(allowed_binary_keys)) {
  if (!curve_available()) throw Error("CURVE requested but libzmq was built without it");
  socket_.set(zmq::sockopt::linger, 0);
  try {
    socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    throw Error(std::string("cannot install the ZAP handler (inproc://zeromq.zap.01): ") +
                e.what() + "; refusing to run CURVE without authentication");
  }
  thread_ = std::thread([this] { run(); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::run() {
  // A short poll timeout is how the thread notices stop_; ZAP traffic is one request per
  // handshake, so the wake-ups cost nothing measurable.
  while (!stop_) {
    zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (item.revents & ZMQ_POLLIN) handle_one();
  }
  socket_.close();
}

void ZapHandler::handle_one() {
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(socket_, std::back_inserter(req))) return;
  // RFC 27 request: version, request id, domain, address, identity, mechanism, credentials...
  // A REP socket must answer every request, so even a malformed one gets a reply (status 500).
  std::string version = req.size() > 0 ? req[0].to_string() : "";
  std::string request_id = req.size() > 1 ? req[1].to_string() : "";
  std::string status = "400", text = "unknown client key", user;
  if (req.size() < 6 || version != "1.0") {
    status = "500";
    text = "malformed ZAP request";
  } else if (req[5].to_string_view() != "CURVE") {
    text = "only CURVE clients are accepted";
  } else if (req.size() >= 7 && req[6].size() == kBinaryKeyBytes &&
             allowed_keys_.count(req[6].to_string()) != 0) {
    status = "200";
    text = "OK";
    char z85[kZ85KeyChars + 1];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), kBinaryKeyBytes);
    user = z85;
  }
  if (status == "200") {
    ++allowed_;
  } else {
    ++denied_;
    spdlog::warn("ZAP: denied a connection from {}: {}",
                 req.size() > 3 ? req[3].to_string() : std::string("?"), text);
  }
  std::vector<zmq::const_buffer> reply = {zmq::buffer(std::string_view("1.0")),
                                          zmq::buffer(request_id),
                                          zmq::buffer(status),
                                          zmq::buffer(text),
                                          zmq::buffer(user),
                                          zmq::buffer(std::string_view(""))};
  zmq::send_multipart(socket_, reply);
}

}  // namespace moebatch::zmq_ingress
