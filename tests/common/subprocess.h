// Real child processes for the tests: a command run to completion with its output captured
// (run_command, and run_cli for the `moebatch` binary), or one kept running (Child) whose stdout
// is read line by line or whose output goes to a log, signalled and waited for with a timeout.
// Exit statuses are one number everywhere: the exit code, or -N when signal N killed it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/common/files.h"

namespace moebatch::test {

/// The `moebatch` CLI built beside the test binaries (MOEBATCH_BIN).
inline std::string moebatch_bin() { return MOEBATCH_BIN; }

/// One argv from pieces laid end to end (a test's own flags around shared flag groups).
inline std::vector<std::string> join_args(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

/// A raw waitpid status as the exit code, or -N when signal N killed the process.
inline int exit_status(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : -WTERMSIG(raw); }

namespace detail {

/// Forks and execs argv[0] with stdout on out_fd and stderr on err_fd (-1: inherited). The fds
/// are expected close-on-exec, so the child keeps only its dup2'd copies. argv is laid out before
/// the fork: between fork and exec the child only calls async-signal-safe functions.
inline pid_t spawn(const std::vector<std::string>& argv, int out_fd, int err_fd) {
  if (argv.empty()) throw std::invalid_argument("spawn: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

/// A close-on-exec pipe: {read end, write end}.
inline std::pair<int, int> make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  return {fds[0], fds[1]};
}

}  // namespace detail

/// A running child process; killed (SIGKILL) and reaped on destruction if still running.
class Child {
 public:
  /// Starts argv[0] with argv; its stdout is read with read_line(), its stderr is inherited so
  /// helper diagnostics reach the test log.
  explicit Child(const std::vector<std::string>& argv) {
    const auto [rd, wr] = detail::make_pipe();
    try {
      pid_ = detail::spawn(argv, wr, -1);
    } catch (...) {
      close(rd);
      close(wr);
      throw;
    }
    close(wr);
    out_ = rd;
  }
  /// Starts argv[0] with argv, stdout and stderr appended to `log` (read back with read_log()).
  Child(const std::vector<std::string>& argv, std::filesystem::path log) : log_(std::move(log)) {
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + log_.string());
    try {
      pid_ = detail::spawn(argv, fd, fd);
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  Child(Child&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), out_(std::exchange(o.out_, -1)), log_(std::move(o.log_)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child& operator=(Child&&) = delete;

  /// Next stdout line (without '\n'); what was read so far at EOF, or once no byte arrived for
  /// timeout_ms. Only for a child started without a log.
  std::string read_line(int timeout_ms = 20000) {
    std::string line;
    char c;
    while (true) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return line;
      if (read(out_, &c, 1) != 1 || c == '\n') return line;
      line.push_back(c);
    }
  }
  /// Everything the child wrote to its log so far.
  std::string read_log() const { return read_file(log_); }
  /// Sends sig (nothing once the child was reaped).
  void signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  /// Waits for the child to end; its exit status (see exit_status).
  int wait() {
    if (pid_ <= 0) throw std::logic_error("Child::wait: already reaped");
    int raw = 0;
    waitpid(pid_, &raw, 0);
    pid_ = -1;
    return exit_status(raw);
  }
  /// The exit status once the child ended, or nullopt while it still runs after `timeout`.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) throw std::logic_error("Child::wait_for: already reaped");
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int raw = 0;
      if (waitpid(pid_, &raw, WNOHANG) == pid_) {
        pid_ = -1;
        return exit_status(raw);
      }
      if (std::chrono::steady_clock::now() > end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  /// Process id; -1 once reaped.
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::filesystem::path log_;
};

/// Output and exit status of a finished command.
struct RunResult {
  int exit_code = -1;      ///< exit code, or -N when signal N killed it
  bool timed_out = false;  ///< it ran past the timeout and was killed
  std::string out;         ///< all of stdout
  std::string err;         ///< all of stderr
};

/// Runs argv to completion (killing it after `timeout`), capturing stdout and stderr apart.
inline RunResult run_command(const std::vector<std::string>& argv,
                             std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto [out_rd, out_wr] = detail::make_pipe();
  const auto [err_rd, err_wr] = detail::make_pipe();
  pid_t pid = -1;
  try {
    pid = detail::spawn(argv, out_wr, err_wr);
  } catch (...) {
    for (int fd : {out_rd, out_wr, err_rd, err_wr}) close(fd);
    throw;
  }
  close(out_wr);
  close(err_wr);
  RunResult r;
  pollfd fds[2] = {{out_rd, POLLIN, 0}, {err_rd, POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  const auto end = std::chrono::steady_clock::now() + timeout;
  // Drain both pipes together so a child filling one cannot deadlock against us.
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    const int ready = left.count() > 0 ? poll(fds, 2, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (const pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  int raw = 0;
  waitpid(pid, &raw, 0);
  r.exit_code = exit_status(raw);
  return r;
}

/// Runs the `moebatch` CLI with args (no shell: each argument as is).
inline RunResult run_cli(std::vector<std::string> args,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  args.insert(args.begin(), moebatch_bin());
  return run_command(args, timeout);
}

}  // namespace moebatch::test
